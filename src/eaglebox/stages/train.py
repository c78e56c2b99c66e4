"""``eaglebox train``: one process, or one per GPU under ``torchrun``. With ``train.data: online | hybrid``
the samples are captured as the loader needs them (:mod:`eaglebox.extract.online`), through one capture
server that this command's rank 0 starts (or ``train.online.url``) and all ranks share."""

from eaglebox.shards.spec import capture_spec


def run(cfg) -> int:
    from eaglebox.train.loop import run_train

    spec = capture_spec(cfg)
    if cfg.train.data == "offline":
        run_train(cfg, spec)
        return 0
    from eaglebox.extract.online import online_samples
    from eaglebox.train.dist import Dist

    d = Dist()  # rank 0 starts the capture server that every rank shares
    with online_samples(cfg, spec, rank=d.rank, world=d.world, share=d.share) as samples:
        run_train(cfg, spec, reader=samples)
    return 0
