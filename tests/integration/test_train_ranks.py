"""Several ranks on the CPU (gloo), no SGLang server.

Each torchrun rank reads only its own samples: the feature files of its slice of every global batch,
and its share of the shard indexes in the vocabulary pass (the shares summed over ranks: the same
draft vocabulary as one process); through ``eaglebox train`` itself, on shards written here in the
shard format (the features are random, the data path is the real one). And the scaling benchmark
(``benchmarks/train_scaling.py --cpu``) times the trainer's step on 1 and 2 ranks.

Run as a script (``python -m torch.distributed.run ... test_train_ranks.py <eaglebox train args>``),
this file records which samples each rank's ``ShardReader`` was asked for, then runs the CLI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
N, ROWS, SHARD = 40, 48, 16  # 40 samples in 3 shards (the last one short)
STEPS, BATCH = 4, 4  # global batch 4: 1 rank x 4, or 2 ranks x 2
ARGS = ["train.max_length=64", "train.log_every=1", "train.ttt_length=2", f"train.max_steps={STEPS}",
        "train.warmup_steps=1", "train.heldout_share=0", "train.checkpoint_every=1000"]


def write_shards(out: Path, spec, hidden: int, num_aux: int, vocab: int) -> None:
    """``N`` samples of random features in ``eaglebox-shards`` format, under ``spec`` (the config's
    capture spec, so the trainer's header check passes)."""
    import torch

    from eaglebox.capture.sink import write_sample
    from eaglebox.shards.format import (
        FORMAT,
        save_manifest,
        shard_dir,
        shard_name,
        write_index,
    )

    g = torch.Generator().manual_seed(0)
    shards = []
    for si in range(-(-N // SHARD)):
        (out / shard_dir(si)).mkdir(parents=True)
        ids, masks, sids, entries = [], [], [], []
        for j in range(min(SHARD, N - si * SHARD)):
            rows = ROWS - (si * SHARD + j) % 7  # a few lengths: padded batches
            x = torch.randint(3, vocab, (rows,), generator=g)
            sid, file = f"s{si}-{j}", f"{shard_dir(si)}/s{si}-{j}.safetensors"
            digest, _, _ = write_sample(out / file, x.tolist(), [torch.randn(rows, num_aux * hidden, generator=g).bfloat16()],
                                        [torch.randn(rows, hidden, generator=g).bfloat16()],
                                        spec.sample_header())  # as the capture server does
            entries.append({"id": sid, "file": file, "offset": sum(len(i) for i in ids), "rows": rows,
                            "sha256": digest})
            ids.append(x.tolist())
            masks.append([0] * (rows // 3) + [1] * (rows - rows // 3))
            sids.append(sid)
        digest, size = write_index(out / shard_name(si), ids, masks, sids, spec)
        shards.append({"file": shard_name(si), "sha256": digest, "bytes": size, "samples": entries})
    save_manifest(out, {"format": FORMAT, "capture": spec.as_json(), "shards": shards})


def record_reads_then_train(argv: list[str]) -> int:
    """Log each feature read (``ShardReader.get``) and each index read outside one (the vocabulary
    pass) to ``$READ_LOG/rank<R>.json``, then run ``eaglebox train``."""
    from eaglebox import cli
    from eaglebox.shards.format import ShardReader

    reads = {"features": [], "index": []}
    inside_get = [False]
    get, ids_and_mask = ShardReader.get, ShardReader.ids_and_mask

    def logged_get(self, i, max_rows=None):
        reads["features"].append(i)
        inside_get[0] = True
        try:
            return get(self, i, max_rows)
        finally:
            inside_get[0] = False

    def logged_ids_and_mask(self, i):
        if not inside_get[0]:
            reads["index"].append(i)
        return ids_and_mask(self, i)

    ShardReader.get, ShardReader.ids_and_mask = logged_get, logged_ids_and_mask
    try:
        return cli.main(argv)
    finally:
        Path(os.environ["READ_LOG"], f"rank{os.environ.get('RANK', '0')}.json").write_text(json.dumps(reads))


def _train(shards: Path, out: Path, ranks: int, batch: int):
    log = out.parent / f"reads-{out.name}"
    log.mkdir(parents=True)
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)] \
        if ranks > 1 else [sys.executable]
    r = subprocess.run([*launch, __file__, "train", "--config", str(ROOT / "configs" / "tiny-cpu.yaml"),
                        f"extract.output_dir={shards}", f"train.output_dir={out}", f"train.batch_size={batch}", *ARGS],
                       cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "READ_LOG": str(log), "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    losses = [json.loads(x)["loss"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    return losses, [json.loads((log / f"rank{k}.json").read_text()) for k in range(ranks)]


@pytest.fixture(scope="module")
def shards(tiny_target, tmp_path_factory) -> Path:
    """Random shards under the tiny config's capture spec (the tiny target's widths; the target is the
    shipped one, copied into .cache/ by the fixture)."""
    from eaglebox.config import load_config
    from eaglebox.shards.spec import capture_spec

    os.chdir(ROOT)  # the config's relative paths are relative to the repository root
    cfg = load_config(ROOT / "configs" / "tiny-cpu.yaml", [])
    spec = capture_spec(cfg)
    hf = json.loads((Path(cfg.model.path) / "config.json").read_text())
    out = tmp_path_factory.mktemp("ranks") / "shards"
    write_shards(out, spec, spec.hidden_size, len(spec.layers.layer_ids), hf["vocab_size"])
    return out


def test_two_ranks_read_disjoint_samples_and_train_as_one(shards, tmp_path):
    from safetensors.torch import load_file

    from eaglebox.config import load_config
    from eaglebox.train.data import batch_indices

    cfg = load_config(ROOT / "configs" / "tiny-cpu.yaml", [])
    one, (reads1,) = _train(shards, tmp_path / "one", 1, BATCH)
    two, reads2 = _train(shards, tmp_path / "two", 2, BATCH // 2)
    assert len(one) == len(two) == STEPS and one == pytest.approx(two, rel=1e-4)

    # the vocabulary pass: one process reads every index entry; two ranks a contiguous half each
    assert sorted(reads1["index"]) == list(range(N))
    assert [sorted(r["index"]) for r in reads2] == [list(range(N // 2)), list(range(N // 2, N))]
    # ... and the shares sum to the same draft vocabulary
    w1, w2 = (load_file(tmp_path / d / "draft" / "model.safetensors") for d in ("one", "two"))
    assert all(w1[k].equal(w2[k]) for k in ("d2t", "t2d"))

    # feature files: each rank reads its slice of each global batch, and no other sample
    want = [[i for s in range(STEPS) for i in batch_indices(N, cfg.train.seed, 0, s, 2, r, BATCH // 2)]
            for r in range(2)]
    assert [sorted(r["features"]) for r in reads2] == [sorted(w) for w in want]  # the loader's threads: any order
    assert not set(want[0]) & set(want[1]) and len(set(want[0] + want[1])) == STEPS * BATCH
    assert sorted(reads1["features"]) == sorted(want[0] + want[1])


FIELDS = {"width", "parallel", "ranks", "backend", "seq", "batch_per_rank", "params", "params_per_rank",
          "tokens_per_step", "scored_per_step", "step_s", "tokens_per_s", "efficiency", "comm_ms", "compute_ms",
          "comm_ops_ms", "peak_gib_per_rank", "peak_rss_gib_per_rank"}


def runs(text: str) -> list[dict]:
    return [json.loads(x) for x in text.splitlines() if x.startswith("{")]


def bench(*args: str) -> list[dict]:
    r = subprocess.run([sys.executable, "benchmarks/train_scaling.py", "--cpu", "--widths", "tiny", "--warmup", "1",
                        "--profile-steps", "1", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return runs(r.stdout)


def test_scaling_benchmark_on_two_ranks_trains_twice_the_tokens_and_fsdp_shards_the_draft(shards):
    from eaglebox.train.data import batch_indices

    one, fsdp = bench("--ranks", "1,2", "--parallel", "fsdp", "--seq", "32", "--batch", "2", "--steps", "1")
    # --shards: each rank's batches read from the shards as the loop reads them (steps 1 and 2 after warm-up)
    (ddp,) = bench("--ranks", "2", "--parallel", "ddp", "--seq", "64", "--batch", "2", "--steps", "2",
                   "--shards", str(shards))
    assert (one["parallel"], fsdp["parallel"], ddp["parallel"]) == ("none", "fsdp", "ddp")
    assert all(FIELDS <= set(x) and "error" not in x for x in (one, fsdp, ddp))
    assert one["tokens_per_step"] == 2 * 32 and one["efficiency"] == 1.0
    # the same per-rank batch: twice the tokens, each rank's step really trained
    assert fsdp["tokens_per_step"] == 2 * one["tokens_per_step"] and 0 < fsdp["scored_per_step"] <= 128
    rows = [sum(ROWS - i % 7 for r in range(2) for i in batch_indices(N, 0, 0, k, 2, r, 2)) for k in (1, 2)]
    assert ddp["data"] == str(shards) and ddp["tokens_per_step"] == sum(rows) / 2
    assert [x["samples"] for x in ddp["read_per_rank"]] == [N, N]
    assert all(x["collate_s"] > 0 for x in ddp["read_per_rank"])
    for two in (fsdp, ddp):
        assert two["ranks"] == 2 and two["backend"] == "gloo" and two["batch_per_rank"] == one["batch_per_rank"]
        assert two["comm_ms"] > 0 and any(k.startswith("gloo:") for k in two["comm_ops_ms"])
        assert two["tokens_per_s"] == pytest.approx(two["tokens_per_step"] / two["step_s"], rel=1e-2)
    assert ddp["params_per_rank"] == [one["params"]] * 2  # DDP replicates the draft, FSDP2 shards it
    assert sum(fsdp["params_per_rank"]) == one["params"] and max(fsdp["params_per_rank"]) < one["params"] * 0.6

    # the committed CPU result: its command, the caveat, and a run per configuration with every field
    text = (ROOT / "benchmarks" / "results" / "train_scaling-cpu.txt").read_text()
    assert "python benchmarks/train_scaling.py --cpu" in text and "nothing about NCCL" in text
    done = runs(text)
    assert {(x["width"], x["parallel"], x["ranks"]) for x in done} >= {("tiny", "none", 1), ("tiny", "ddp", 2),
                                                                      ("tiny", "fsdp", 2)}
    assert all(FIELDS <= set(x) for x in done)

if __name__ == "__main__":
    sys.exit(record_reads_then_train(sys.argv[1:]))
