"""Which scheduler processes write capture files, with ranks placed by SGLang 0.5.23's own rules."""

import pytest

from eaglebox.capture.hook import writes_on_this_rank

pytest.importorskip("sglang")
from sglang.srt.layers.dp_attention import compute_dp_attention_world_info  # noqa: E402
from sglang.srt.runtime_context import ParallelContext  # noqa: E402


def writers(tp_size: int, attn_dp_size: int) -> list[int]:
    out = []
    for tp_rank in range(tp_size):
        attn_tp_rank, attn_tp_size, attn_dp_rank, _ = compute_dp_attention_world_info(tp_rank, tp_size, attn_dp_size)
        parallel = ParallelContext()
        parallel.override_permanently(tp_size=tp_size, tp_rank=tp_rank, attn_tp_size=attn_tp_size,
                                      attn_tp_rank=attn_tp_rank, attn_dp_rank=attn_dp_rank)
        if writes_on_this_rank(parallel):
            out.append(tp_rank)
    return out


@pytest.mark.parametrize(("attn_dp_size", "expected"), [(1, [0]), (2, [0, 4]), (8, list(range(8)))])
def test_one_writer_per_attention_group(attn_dp_size, expected):
    """TP 8: without DP attention only rank 0 writes; with --enable-dp-attention --dp N each group's
    first rank writes, since each group schedules requests no other group sees."""
    assert writers(8, attn_dp_size) == expected
