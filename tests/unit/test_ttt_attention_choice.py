"""The TTT attention kernel follows the device's reported shared memory per block (SM120 note as code):
torch's default flex blocks on H100/H200, small flex blocks on Blackwell workstation GPUs (~99 KB),
the dense eager reference below that; the choice is logged and kept for the run report."""

from types import SimpleNamespace

import torch

from eaglebox.train import ttt

H200 = 232448          # shared_memory_per_block_optin of an H200 (227 KB)
RTX_PRO_6000 = 101376  # of an RTX PRO 6000 Blackwell / RTX 5090 (99 KB)


def test_choice_follows_the_reported_limit():
    assert ttt.attention_choice(H200) == {**ttt.attention_choice(H200), "kernel": "flex", "kernel_options": None}
    assert ttt.attention_choice(None)["kernel_options"] is None  # not reported: torch's defaults
    small = ttt.attention_choice(RTX_PRO_6000)
    assert small["kernel"] == "flex" and small["kernel_options"] == ttt.SMALL_SMEM_KERNEL_OPTIONS
    assert small["kernel_options"]["bwd_BLOCK_M1"] < 64 and small["kernel_options"]["bwd_num_stages"] == 1
    # flex needs the mask's 128-token sparse blocks to be a multiple of the kernel blocks
    assert all(128 % small["kernel_options"][k] == 0 for k in small["kernel_options"] if "BLOCK" in k)
    assert ttt.attention_choice(48 * 1024)["kernel"] == "eager"
    assert "101376" in small["reason"]


def test_device_choice_reads_the_device_and_is_recorded(monkeypatch, capsys):
    props = {"cuda:0": SimpleNamespace(name="NVIDIA RTX PRO 6000 Blackwell", major=12, minor=0,
                                       shared_memory_per_block_optin=RTX_PRO_6000),
             "cuda:1": SimpleNamespace(name="NVIDIA H200", major=9, minor=0, shared_memory_per_block_optin=H200)}
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: props[str(d)])
    monkeypatch.setattr(ttt, "_attention_choices", {})
    a = ttt.device_attention_choice(torch.device("cuda:0"))
    b = ttt.device_attention_choice(torch.device("cuda:1"))
    assert a["kernel_options"] == ttt.SMALL_SMEM_KERNEL_OPTIONS and a["capability"] == "12.0"
    assert b["kernel_options"] is None
    out = capsys.readouterr().out
    assert "train: attention flex on NVIDIA RTX PRO 6000 Blackwell (sm_120)" in out and "small flex blocks" in out
    ttt.device_attention_choice(torch.device("cuda:0"))  # made once a device
    assert capsys.readouterr().out == ""
    assert set(ttt.attention_choices()) == {"cuda:0", "cuda:1"}
