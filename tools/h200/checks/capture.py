"""H200 check of capture through real SGLang 0.5.23 (CUDA graphs and overlap scheduling on, triton
attention, torch stand-ins for sgl_kernel):

(a) parity: a random-weight Llama at Llama-3.1-8B width (hidden 4096, 6 layers), a few prompts; every
    captured layer and the last hidden state against transformers' bf16 forward: cos >= 0.999;
(b) concurrent: 96 prompts of 16-3000 tokens sent 64 at a time with chunked prefill (1024) on a
    hidden-2048 Llama; every sample's rows against a per-sample reference forward (a row under
    0.99 cosine is a mismatch). With --before DIR, (b) also runs with the capture hook and sink from
    DIR (the code before the fix) first.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from common import (
    SMALL,
    WIDE,
    capture,
    compare,
    config_for,
    load_reference,
    make_llama,
    random_prompts,
    write_result,
)


def parity() -> bool:
    path = make_llama("wide", 6, WIDE)
    cfg = config_for(path, "parity", 31000, [0, 2, 4], chunked_prefill=512)
    reader, spec, _ = capture(cfg, random_prompts(6, 64, 1200, seed=1), "parity-server")
    rows = compare(reader, spec, load_reference(path))
    keys = [k for k in rows[0] if k not in ("sample", "rows")]
    worst = {k: min(r[k]["cos"] for r in rows) for k in keys}
    ok = all(v >= 0.999 for v in worst.values())
    print(f"(a) parity, hidden 4096, {len(rows)} samples, {sum(r['rows'] for r in rows)} rows: "
          + ", ".join(f"{k} cos>={v:.6f}" for k, v in worst.items()) + f" -> {'PASS' if ok else 'FAIL'}")
    write_result("parity", {"samples": rows, "worst_cos": worst, "pass": ok, "layer_ids": list(spec.layers.layer_ids),
                            "captured_layer_inputs": list(spec.layers.captured_layer_inputs)})
    return ok


def concurrent(tag: str) -> int:
    path = make_llama("small", 4, SMALL)
    cfg = config_for(path, f"concurrent-{tag}", 31100, [0, 1, 2], chunked_prefill=1024)
    shutil.rmtree(cfg.extract.output_dir, ignore_errors=True)
    reader, spec, _ = capture(cfg, random_prompts(96, 16, 3000, seed=2), f"concurrent-{tag}-server")
    rows = compare(reader, spec, load_reference(path))
    bad = [r for r in rows if any(v["min_row_cos"] < 0.99 for k, v in r.items() if isinstance(v, dict))]
    worst = min(v["min_row_cos"] for r in rows for v in r.values() if isinstance(v, dict))
    print(f"(b) concurrent [{tag}]: {len(rows)} samples, {sum(r['rows'] for r in rows)} rows, 64 in flight, "
          f"chunked prefill 1024: {len(bad)} mismatched samples (worst row cos {worst:.4f})")
    write_result(f"concurrent-{tag}", {"samples": rows, "mismatched": [r["sample"] for r in bad]})
    return len(bad)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", type=Path, help="hook.py and sink.py of the capture code before the fix")
    a = ap.parse_args()
    ok = parity()
    if a.before:
        import eaglebox.capture

        CAPTURE_SRC = Path(eaglebox.capture.__file__).parent
        saved = {f: (CAPTURE_SRC / f).read_bytes() for f in ("hook.py", "sink.py")}
        for f in saved:
            shutil.copy(a.before / f, CAPTURE_SRC / f)
        try:
            concurrent("before")
        finally:
            for f, data in saved.items():
                (CAPTURE_SRC / f).write_bytes(data)
    ok = concurrent("after") == 0 and ok
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
