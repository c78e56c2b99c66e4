"""A run's disk (``eaglebox.train.checkpoint``): a run whose checkpoints and drafts cannot fit the free disk is
refused before its first step, naming the directory and the sizes; a checkpoint whose write fails (here: a file
size limit, as a full disk fails it) leaves no partial directory and keeps the last complete one. On the H100 on
2026-12-08 a served check's extraction left too little room and the trainer died writing its last checkpoint,
after training (``benchmarks/results/served-h100-2026-12-08-s28/``)."""

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from eaglebox.draft.spec import DraftSpec
from eaglebox.errors import EagleboxError
from eaglebox.train import checkpoint
from eaglebox.train.model import Eagle3Draft


def spec(hidden: int, vocab: int, draft_vocab: int) -> DraftSpec:
    return DraftSpec(hidden_size=hidden, target_hidden_size=hidden, num_aux=3, num_attention_heads=8,
                     num_key_value_heads=2, head_dim=hidden // 8, intermediate_size=3 * hidden, vocab_size=vocab,
                     draft_vocab_size=draft_vocab, rms_norm_eps=1e-5, rope_theta=10000.0, rope_scaling=None,
                     max_position_embeddings=4096)


def test_run_bytes_counts_keep_plus_one_checkpoints_less_those_present_and_two_bf16_drafts():
    m = Eagle3Draft(spec(64, 128, 64))
    numel = sum(p.numel() for p in m.parameters() if p.requires_grad)
    assert checkpoint.run_bytes(m, keep=2) == (3 * 12 * numel + 4 * numel, 12 * numel)
    assert checkpoint.run_bytes(m, keep=2, present=2)[0] == 12 * numel + 4 * numel
    assert checkpoint.run_bytes(m, keep=2, present=5)[0] == 4 * numel  # more present than kept: pruned, not counted


def test_a_run_whose_checkpoints_do_not_fit_the_free_disk_is_refused_naming_the_directory(tmp_path):
    with torch.device("meta"):  # Kimi-K2.5's width: a 1.4 B-parameter draft, ~17 GB a checkpoint
        m = Eagle3Draft(spec(7168, 163840, 32000))
    ckpt = tmp_path / "train" / "checkpoints"  # not made yet: the free space is the nearest existing parent's
    _, one = checkpoint.run_bytes(m, keep=1)
    keep = shutil.disk_usage(tmp_path).free // one + 1  # one more checkpoint than the disk holds
    with pytest.raises(EagleboxError) as err:
        checkpoint.check_room(ckpt, m, keep)
    msg = str(err.value)
    assert str(ckpt) in msg and f"train.keep_checkpoints={keep}" in msg and f"{one / 1e9:.1f} GB each" in msg, msg
    assert not ckpt.exists()
    small = Eagle3Draft(spec(64, 128, 64))  # a small draft fits
    need, free = checkpoint.check_room(ckpt, small, keep=2)
    assert need == checkpoint.run_bytes(small, 2)[0] and free >= need


WRITE = textwrap.dedent("""
    import resource, signal, sys
    from pathlib import Path
    import torch
    from eaglebox.errors import EagleboxError
    from eaglebox.train import checkpoint
    from eaglebox.train.model import Eagle3Draft
    sys.path.insert(0, sys.argv[2])
    from test_checkpoint_disk import spec
    torch.manual_seed(0)
    m = Eagle3Draft(spec(64, 128, 64))
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    ckpt = Path(sys.argv[1])
    def save(step):
        return checkpoint.save(ckpt, step, m, opt, sched, {"epoch": 0, "step_in_epoch": step}, 0, 1, lambda: None, 2, {})
    save(1)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of a signal
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
    try:
        save(2)
    except EagleboxError as err:
        print(err)
        sys.exit(3)
""")


def test_a_checkpoint_write_that_fails_leaves_no_partial_directory_and_keeps_the_last_complete_one(tmp_path):
    ckpt = tmp_path / "checkpoints"
    r = subprocess.run([sys.executable, "-c", WRITE, str(ckpt), str(Path(__file__).parent)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stdout + r.stderr
    assert f"{ckpt / 'step-00000002'}: the checkpoint could not be written" in r.stdout, r.stdout
    assert "run the same command to resume" in r.stdout
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-00000001"]  # no .step-00000002.tmp left
    assert checkpoint.latest(ckpt).name == "step-00000001"
    assert {"model.safetensors", "optim.pt", "state.json", "rng-rank0.pt"} <= {p.name for p in (ckpt / "step-00000001").iterdir()}
