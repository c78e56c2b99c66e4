"""``eaglebox VERB --config CONFIG [dotted.key=value ...]``: thin dispatch to the stage modules."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from eaglebox.config import ConfigError, dump_config, load_config
from eaglebox.errors import EagleboxError

STAGES = {
    "extract": "capture the target's EAGLE-3 features to shards through a patched SGLang server",
    "train": "train an EAGLE-3 draft on the shards (torchrun for several GPUs)",
    "export": "write the SGLang-loadable draft directory from the last checkpoint",
    "parity": "compare captured shards with an independent HF forward, layer by layer",
    "serve": "serve target + draft with SGLang EAGLE-3",
    "bench": "measure acceptance length and tok/s against the target alone",
    "check": "the consistency gate: extract -> train -> export -> acceptance",
}


TINY_ARCHS = {"llama": Path(".cache/tiny"), "deepseek_v3": Path(".cache/tiny-mla")}
"""``eaglebox tiny --arch``: the tiny targets and their default directories."""


def _stage(name: str):
    """Import lazily: ``eaglebox config show`` must not pay for torch."""
    import importlib

    return importlib.import_module(f"eaglebox.stages.{name}").run


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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
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
            print(dump_config(load_config(args.config, args.overrides)), end="")
            return 0
        cfg = load_config(args.config, args.overrides)
        return _stage(args.verb)(cfg) or 0
    except ConfigError as err:
        print(f"eaglebox: config error:\n{err}", file=sys.stderr)
        return 2
    except (EagleboxError, FileNotFoundError) as err:
        print(f"eaglebox {args.verb}: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
