"""``eaglebox train``: one process, or one per GPU under ``torchrun``. With ``train.data: online | hybrid``
the samples are captured as the loader needs them (:mod:`eaglebox.extract.online`), through a capture
server this command starts (or ``train.online.url``)."""

from eaglebox.shards.spec import capture_spec


def run(cfg) -> int:
    from eaglebox.train.loop import run_train

    spec = capture_spec(cfg)
    if cfg.train.data == "offline":
        run_train(cfg, spec)
        return 0
    from eaglebox.extract.online import online_samples

    with online_samples(cfg, spec) as samples:
        run_train(cfg, spec, reader=samples)
    return 0
