"""``eaglebox VERB --config CONFIG [dotted.key=value ...]``: thin dispatch to the stage modules."""

from __future__ import annotations

import argparse
import errno
import json
import sys
from pathlib import Path

from eaglebox.config import ConfigError, dump_config, load_config
from eaglebox.errors import EagleboxError
from eaglebox.progress import end_bars

STAGES = {
    "extract": "capture the target's EAGLE-3 features to shards through a patched SGLang server",
    "train": "train an EAGLE-3 draft on the shards (torchrun for several GPUs)",
    "export": "write the SGLang-loadable draft directory from the last checkpoint",
    "parity": "compare captured shards with an independent HF forward, layer by layer",
    "serve": "serve target + draft with SGLang EAGLE-3",
    "bench": "measure acceptance length and tok/s against the target alone",
    "check": "the consistency gate: extract -> train -> export -> acceptance",
    "capture-server": "a capture server for online training (train.online.url), until interrupted",
}


STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM}
"""Errors of the disk or the folder a stage writes to: one line with their cause, never a traceback."""

TINY_ARCHS = {"llama": Path(".cache/tiny"), "deepseek_v3": Path(".cache/tiny-mla")}
"""``eaglebox tiny --arch``: the tiny targets and their default directories."""


def _load(path: Path, overrides: list[str]):
    try:
        return load_config(path, overrides)
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text (byte {err.start}: {err.object[err.start:err.start + 1]!r}); "
                          "save the config as UTF-8") from None


def check_config(cfg, path: Path) -> None:
    """Refuse, before anything starts, what the commands would refuse later: the target's
    ``config.json`` unreadable or without what eaglebox reads, an architecture whose SGLang layer rule
    is unknown, layer ids the target does not have, an engine the launch refuses (torch_native for an
    MLA target on CPU, no ``engine.max_total_tokens`` on CPU), a draft shape or RoPE the trainer and
    SGLang would read differently. Reads ``config.json`` only (no weights, no torch)."""
    from eaglebox.draft.spec import draft_spec
    from eaglebox.engine.launch import base_args, hidden_state_options
    from eaglebox.shards.spec import DTYPE_BYTES
    from eaglebox.target.config import text_config
    from eaglebox.target.layers import sglang_layer_ids

    target = Path(cfg.model.path) / "config.json"
    try:
        text = text_config(cfg.model.path)
        missing = [k for k in ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size",
                               "vocab_size") if k not in text]
        if missing:
            raise EagleboxError(f"{target}: no {', '.join(missing)}; model.path must name an HF-style target "
                                "directory whose config.json gives its shape")
        ids = sglang_layer_ids(cfg)
        dtype = hidden_state_options(cfg)["dtype"]
        if dtype not in DTYPE_BYTES:
            raise EagleboxError(f"model.dtype: auto reads {dtype!r} from {target}, which eaglebox cannot capture "
                                f"in; set model.dtype to one of {', '.join(DTYPE_BYTES)}")
        base_args(cfg)
        draft_spec(cfg.model.path, cfg.train.draft, len(ids))
    except FileNotFoundError as err:  # model.path: cannot read .../config.json
        raise EagleboxError(f"{path}: {err}; set model.path to the target's directory") from None
    except EagleboxError as err:
        raise EagleboxError(f"{path}: {err}") from None
    except json.JSONDecodeError as err:
        raise EagleboxError(f"{path}: model.path: {target} is not valid JSON ({err})") from None
    except ValueError as err:  # the launch's own checks name their key (e.g. engine.max_total_tokens)
        raise EagleboxError(f"{path}: {err}; set it in the config or as an override") from None
    except (KeyError, TypeError) as err:
        raise EagleboxError(f"{path}: model.path: {target} has an unexpected shape ({type(err).__name__}: {err}); "
                            "model.path must name an HF-style target directory") from None


def _stage(name: str):
    """Import lazily: ``eaglebox config show`` must not pay for torch."""
    import importlib

    return importlib.import_module(f"eaglebox.stages.{name.replace('-', '_')}").run


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="eaglebox", description=__doc__)
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    for name, help_text in STAGES.items():
        s = sub.add_parser(name, help=help_text)
        s.add_argument("--config", required=True, type=Path)
        s.add_argument("overrides", nargs="*", metavar="key=value")
    c = sub.add_parser("config", help="show the resolved config")
    c.add_argument("action", choices=["show"])
    c.add_argument("config", type=Path)
    c.add_argument("overrides", nargs="*", metavar="key=value")
    t = sub.add_parser("tiny", help="create the tiny CPU chat target and its chat data set (cached)")
    t.add_argument("--arch", choices=sorted(TINY_ARCHS), default="llama",
                   help="llama (default), or deepseek_v3: Kimi-K2.5's shape (MLA, MoE, yarn, a remote-code tokenizer)")
    t.add_argument("--out", type=Path, default=None, help="default: .cache/tiny (llama), .cache/tiny-mla (deepseek_v3)")
    return p


def _run(args: argparse.Namespace) -> int:
    if args.verb == "tiny":
        from eaglebox_dev.tiny import write_chat_data

        if args.arch == "deepseek_v3":
            from eaglebox_dev.tiny_mla import make_tiny_mla_target as make
        else:
            from eaglebox_dev.tiny import make_tiny_target as make
        out = args.out or TINY_ARCHS[args.arch]
        make(out / "target")
        paths = write_chat_data(out / "data")
        print(f"tiny data: {paths['train']} and {paths['heldout']}")
        return 0
    if args.verb == "config":
        cfg = _load(args.config, args.overrides)
        check_config(cfg, args.config)
        print(dump_config(cfg), end="")
        return 0
    cfg = _load(args.config, args.overrides)
    check_config(cfg, args.config)
    return _stage(args.verb)(cfg) or 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        try:
            return _run(args)
        finally:
            end_bars()  # an error printed below stands on its own line, after the bar, not on it
    except ConfigError as err:
        print(f"eaglebox: config error:\n{err}", file=sys.stderr)
        return 2
    except (EagleboxError, FileNotFoundError) as err:
        print(f"eaglebox {args.verb}: {err}", file=sys.stderr)
        return 1
    except OSError as err:
        if err.errno not in STORAGE_ERRNOS:
            raise
        print(f"eaglebox {args.verb}: {err} (what was committed before it is kept: free the space or fix the "
              "folder, then run the same command again to resume)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
