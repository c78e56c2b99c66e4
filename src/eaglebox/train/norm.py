"""RMSNorm as SGLang computes it (in float32, then back to the input dtype, times the weight)."""

from __future__ import annotations

import torch
from torch import nn


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    x = x.float()
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)


class RMSNorm(nn.Module):
    """A norm's weight, under the name SGLang's checkpoint gives it; the norm is :func:`rms_norm`,
    applied to the step's cast copy of it (``Eagle3Draft.step_weights``)."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
