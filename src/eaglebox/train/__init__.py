"""EAGLE-3 draft training: model, TTT loss, data order, checkpoints, the loop."""
