"""Loss and accuracy per TTT position over steps, from metrics.jsonl, as one PNG."""

from __future__ import annotations

import json
from pathlib import Path


def plot_metrics(metrics: Path, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in Path(metrics).read_text().splitlines() if line]
    steps = [r["step"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for i in range(len(rows[0]["loss_per_position"])):
        a.plot(steps, [r["loss_per_position"][i] for r in rows], label=f"pos {i}")
        b.plot(steps, [r["acc_per_position"][i] for r in rows], label=f"pos {i}")
    a.set(title="loss per TTT position", xlabel="step", yscale="log")
    b.set(title="top-1 accuracy per TTT position", xlabel="step", ylim=(0, 1))
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
