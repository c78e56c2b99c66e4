"""Rank bookkeeping for ``torchrun``: NCCL on GPU, gloo on CPU, no process group for one process."""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist


class Dist:
    """Rank bookkeeping; a single process is world 1 without a process group."""

    def __init__(self):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if torch.cuda.is_available():
            torch.cuda.set_device(self.local_rank)
            self.device = torch.device("cuda", self.local_rank)
        else:
            self.device = torch.device("cpu")
        if self.world > 1 and not dist.is_initialized():
            dist.init_process_group("nccl" if self.device.type == "cuda" else "gloo")

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def share(self, obj):
        """Rank 0's ``obj`` (picklable) on every rank: what rank 0 alone set up, such as its capture server's
        url. Over a gloo group without the training collectives' timeout: rank 0's server start and answer
        regeneration may take hours (torchrun stops the other ranks if rank 0 dies meanwhile)."""
        if self.world > 1:
            group = dist.new_group(backend="gloo", timeout=timedelta(days=7))
            box = [obj]
            dist.broadcast_object_list(box, src=0, group=group)
            dist.destroy_process_group(group)
            obj = box[0]
        return obj

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            dist.all_reduce(t)
        return t
