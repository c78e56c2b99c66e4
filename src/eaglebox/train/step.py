"""One optimizer step, shared by the training loop and ``benchmarks/train_throughput.py`` (which
imports only torch and this package's model, so it runs on a bare GPU machine)."""

from __future__ import annotations

import torch

from eaglebox.train.dist import Dist
from eaglebox.train.graphs import GraphedStep, make_capturable


def make_optimizer(params: list[torch.nn.Parameter], lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW; on CUDA the fused kernel (one launch over all tensors)."""
    fused = params[0].device.type == "cuda"
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay, fused=fused or None)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter],
               batch: dict, head: torch.Tensor, weights: torch.Tensor, max_grad_norm: float, d: Dist):
    """One optimizer step (under the caller's autocast). Returns the gradient norm and this rank's
    [3, ttt] sums of losses, top-1 hits and scored positions, on the device: nothing here waits for
    the GPU, so the next batch is read while this one computes."""
    losses, correct, counts = model(batch, head, len(weights))
    denom = d.sum(counts[0].detach().float()).clamp_min(1)
    loss = (weights * losses).sum() / denom * d.world  # DDP and FSDP average gradients
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    optimizer.step()
    return grad_norm, torch.stack([losses.detach(), correct.float(), counts.float()])


def make_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter],
              head: torch.Tensor, weights: torch.Tensor, max_grad_norm: float, d: Dist, *, bf16: bool, graphs: bool):
    """The loop's step, batch -> (grad norm, stats): :func:`train_step` under bf16 autocast (CUDA)
    when ``bf16``, replayed through CUDA graphs when ``graphs`` (one CUDA process; call after a
    checkpoint is loaded, since the optimizer is made capturable here)."""
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False) if bf16 \
        else torch.autocast(d.device.type, enabled=False)

    def step(batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        with autocast:
            return train_step(model, optimizer, params, batch, head, weights, max_grad_norm, d)

    if not graphs:
        return step
    make_capturable(optimizer)
    return GraphedStep(step)
