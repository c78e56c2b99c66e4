"""The run report's plots, as one PNG: loss and accuracy per TTT position over steps (metrics.jsonl),
and, when the run evaluated held-out samples (evals.jsonl), the simulated acceptance length and the
acceptance rate per draft position over steps."""

from __future__ import annotations

import json
from pathlib import Path


def _rows(path: Path | None) -> list[dict]:
    if path is None or not Path(path).exists():
        return []
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line]


def plot_metrics(metrics: Path, out: Path, evals: Path | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, ev = _rows(metrics), _rows(evals)
    steps = [r["step"] for r in rows]
    fig, axes = plt.subplots(1, 4 if ev else 2, figsize=(22 if ev else 11, 4))
    a, b = axes[0], axes[1]
    for i in range(len(rows[0]["loss_per_position"])):
        a.plot(steps, [r["loss_per_position"][i] for r in rows], label=f"pos {i}")
        b.plot(steps, [r["acc_per_position"][i] for r in rows], label=f"pos {i}")
    a.set(title="loss per TTT position", xlabel="step", yscale="log")
    b.set(title="top-1 accuracy per TTT position", xlabel="step", ylim=(0, 1))
    b.legend(fontsize=8)
    if ev:
        c, e = axes[2], axes[3]
        es = [r["step"] for r in ev]
        c.plot(es, [r["accept_length"] for r in ev], marker="o")
        best = max((r for r in ev if r["step"] > 0), key=lambda r: r["accept_length"], default=None)
        if best is not None:
            c.scatter([best["step"]], [best["accept_length"]], s=120, facecolors="none", edgecolors="red",
                      label=f"best (step {best['step']})")
            c.legend(fontsize=8)
        c.set(title=f"held-out simulated AL (chain of {ev[0]['num_steps']})", xlabel="step",
              ylim=(1, ev[0]["num_steps"] + 1))
        for k in range(len(ev[0]["accept_rate_per_position"])):
            e.plot(es, [r["accept_rate_per_position"][k] for r in ev], marker=".", label=f"draft token {k + 1}")
        e.set(title="held-out acceptance rate per position", xlabel="step", ylim=(0, 1))
        e.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
