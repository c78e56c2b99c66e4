"""tools/h200/checks/served.py's arithmetic that decides a GPU figure, checked here since CI has no GPU."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

CHECKS = Path(__file__).resolve().parents[2] / "tools" / "h200" / "checks"


def _served():
    path = list(sys.path)
    sys.path.insert(0, str(CHECKS))  # served.py imports common.py from beside it
    try:
        spec = importlib.util.spec_from_file_location("served_check", CHECKS / "served.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path[:] = path
    return mod


def test_steady_rate_leaves_the_warm_up_out(tmp_path):
    """Rows as the trainer logs them (cumulative tokens/s and elapsed seconds): 10 s of warm-up for 1,000
    tokens, then 4,000 tok/s. The steady rate past the third row is 4,000; the last row's cumulative rate is
    not."""
    tokens, elapsed, rows = 0, 0.0, []
    for step in range(1, 9):
        dt, dtok = (10.0, 1000) if step == 1 else (1.0, 4000)
        tokens, elapsed = tokens + dtok, elapsed + dt
        rows.append({"step": step, "tokens_per_s": tokens / elapsed, "elapsed_s": elapsed})
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert _served().steady_tok_s(metrics, skip=2) == pytest.approx(4000)
    assert rows[-1]["tokens_per_s"] < 2000
