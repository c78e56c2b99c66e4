"""The training step replayed as one CUDA graph per batch shape.

An unrolled TTT step launches thousands of kernels (seven draft steps forward and back, the
optimizer). A captured graph replays the whole step -- forward, backward, clipping, AdamW -- with
one launch, so the Python thread is free to read the next batch while the GPU works. (On the
H200 benchmark the step is GPU-bound and graphs gain only 1 %.) Batches are padded to a multiple
of 128 tokens, so a run sees few shapes, and all graphs share one memory pool: they run one after
the other, and nothing they allocate outlives a replay except what is copied out. Only for one
CUDA process: under DDP or FSDP the step runs eagerly.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Step = Callable[[dict], tuple[torch.Tensor, ...]]


def make_capturable(optimizer: torch.optim.Optimizer) -> None:
    """Let ``optimizer.step()`` be captured: a graph replays the scalars it captured, so the
    learning rate becomes a device tensor that the LR scheduler fills in place. Call after a
    checkpoint is loaded (it restores the learning rate)."""
    for group in optimizer.param_groups:
        group["capturable"] = True
        group["lr"] = torch.as_tensor(group["lr"], dtype=torch.float32, device=group["params"][0].device).clone()


class GraphedStep:
    """Calls ``step(batch)`` through CUDA graphs. The first batch of each shape runs eagerly (a real
    step: it compiles the step's kernels for that shape and creates the optimizer state), then the
    step is captured on a copy of that batch; later batches of that shape are copied in and replayed.
    ``step`` must not sync with the host and must take every changing value (the learning rate
    included) from tensors, since a graph replays the values it captured."""

    def __init__(self, step: Step):
        self.step = step
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, dict, tuple]] = {}

    def __call__(self, batch: dict) -> tuple[torch.Tensor, ...]:
        key = tuple((k, tuple(v.shape), v.dtype) for k, v in sorted(batch.items()))
        if key not in self.graphs:
            return self._warm_up_and_capture(key, batch)
        graph, static_batch, static_out = self.graphs[key]
        for k, v in batch.items():
            static_batch[k].copy_(v)
        graph.replay()
        return tuple(t.clone() for t in static_out)  # the next replay of any graph overwrites these

    def _warm_up_and_capture(self, key: tuple, batch: dict) -> tuple[torch.Tensor, ...]:
        side = torch.cuda.Stream()  # warm-up off the default stream, as capture requires
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out = self.step(batch)
        torch.cuda.current_stream().wait_stream(side)
        out = tuple(t.clone() for t in out)
        static_batch = {k: v.clone() for k, v in batch.items()}
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # hand the eager step's cached blocks back before the pool grows
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            static_out = self.step(static_batch)
        self.graphs[key] = (graph, static_batch, static_out)
        return out
