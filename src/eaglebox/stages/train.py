"""``eaglebox train``: one process, or one per GPU under ``torchrun``."""

from eaglebox.shards.spec import capture_spec


def run(cfg) -> int:
    from eaglebox.train.loop import run_train

    run_train(cfg, capture_spec(cfg))
    return 0
