"""Distributed training under torchrun: the process group, and what ranks agree on."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world_size: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0


ONE_PROCESS = Dist()  # the default: no torchrun, no process group


def setup_distributed() -> Dist:
    """torchrun sets WORLD_SIZE/RANK/LOCAL_RANK: join the process group (gloo on CPU, nccl on GPUs, one GPU per
    rank: this process's default CUDA device becomes GPU LOCAL_RANK of its machine)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return Dist()
    if not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return Dist(rank=dist.get_rank(), world_size=dist.get_world_size())


def barrier(d: Dist) -> None:
    """Wait for every rank (nothing to wait for in one process)."""
    if d.world_size > 1:
        dist.barrier()


def broadcast(value, d: Dist):
    """Rank 0's value on every rank (e.g. which index version to use this step)."""
    if d.world_size == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def on_every_rank(flag: bool, d: Dist) -> bool:
    """True when `flag` is true on every rank (e.g. every rank could read a file)."""
    if d.world_size == 1:
        return flag
    flags: list = [None] * d.world_size
    dist.all_gather_object(flags, flag)
    return all(flags)
