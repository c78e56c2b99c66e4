"""``eaglebox serve``: SGLang with target + draft (EAGLE-3), in the foreground until interrupted."""

import os
import sys

from eaglebox.engine.launch import launch_args, launch_env


def run(cfg) -> int:
    mode = "plain"
    if cfg.serve.draft_path is not None:
        from eaglebox.serve.provenance import check_provenance
        from eaglebox.shards.spec import capture_spec

        check_provenance(cfg.serve, capture_spec(cfg))
        mode = "speculative"
    args = [sys.executable, "-m", "sglang.launch_server", *launch_args(cfg, mode)]
    print("serve:", " ".join(args), flush=True)
    os.execvpe(args[0], args, {**os.environ, **launch_env(cfg, mode)})
