"""One module a CLI verb: each ``run(cfg)`` wires the config to the stage's own package."""
