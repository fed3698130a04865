"""Training past one process: ``torchrun`` ranks, batch shards and summed gradients.

Under ``torchrun --nproc_per_node N batchfold train TASK`` (or a multi-node ``torchrun``),
every rank makes the same shuffled batches (they depend on the seed and the epoch only),
takes its contiguous share of each batch, builds and runs its own plan, and the gradients of
all ranks are summed with one ``all_reduce`` per batch, so a step equals one process's step
on the whole batch (the tasks' losses are sums over items). Parameters that a rank's share
does not reach (a ``OneOf`` case unused on one rank) take part with zeros, so no rank waits
for a gradient that never comes. Sparse embedding gradients are summed as sparse tensors.
Rank 0 alone writes files and evaluates; checkpoints hold no rank state, so a run resumes
with any number of processes.

Why not ``DistributedDataParallel``: its reducer learns which parameters a step uses from
``DDP.forward``, but a batched step reaches the model's modules through ``batch_map`` or a
compiled blocks model, not through ``forward``; one summed ``all_reduce`` after backward is
the same arithmetic with nothing to keep in step.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class Ranks:
    """This process's rank among ``world`` processes (``Ranks()`` is one process alone)."""

    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        """Whether this process writes files and evaluates (rank 0)."""
        return self.rank == 0

    def share(self, items: Sequence[Any]) -> list[Any]:
        """This rank's contiguous share of a batch (shares differ in size by at most one).

        Example:
            >>> [Ranks(r, 3).share(list(range(7))) for r in range(3)]
            [[0, 1, 2], [3, 4], [5, 6]]
        """
        n, world = len(items), self.world
        start = self.rank * (n // world) + min(self.rank, n % world)
        stop = start + n // world + (1 if self.rank < n % world else 0)
        return list(items[start:stop])


def setup(device: str) -> Ranks:
    """Join the process group ``torchrun`` describes (``WORLD_SIZE`` > 1), or run alone.

    The backend is gloo on CPU and NCCL on CUDA.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Ranks()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if str(device).startswith("cuda") else "gloo")
    return Ranks(dist.get_rank(), dist.get_world_size())


def sum_gradients(model: nn.Module, ranks: Ranks) -> None:
    """Sum every parameter's gradient over all ranks (missing gradients count as zeros).

    Dense gradients go in one flat ``all_reduce``; each sparse gradient goes in one of its own.
    """
    if ranks.world == 1:
        return
    dense: list[torch.Tensor] = []
    for param in model.parameters():
        if not param.requires_grad:
            continue
        if param.grad is None:
            param.grad = torch.zeros_like(param)
        if param.grad.is_sparse:
            dist.all_reduce(param.grad)
        else:
            dense.append(param.grad)
    if dense:
        flat = torch.cat([g.reshape(-1) for g in dense])
        dist.all_reduce(flat)
        offset = 0
        for grad in dense:
            grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
            offset += grad.numel()


def sum_values(values: Sequence[float], ranks: Ranks) -> list[float]:
    """``values`` summed over all ranks (one small ``all_reduce``)."""
    if ranks.world == 1:
        return list(values)
    tensor = torch.tensor(list(values), dtype=torch.float64)
    dist.all_reduce(tensor)
    return tensor.tolist()


def barrier(ranks: Ranks) -> None:
    """Wait for every rank (a no-op alone)."""
    if ranks.world > 1:
        dist.barrier()


def broadcast_object(value: Any, ranks: Ranks) -> Any:
    """Rank 0's ``value`` on every rank."""
    if ranks.world == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_state(value: Any, ranks: Ranks) -> list[Any]:
    """Every rank's ``value`` (plain data and tensors, as a checkpoint holds), in rank order,
    on rank 0 (``[]`` on the others). It travels as ``torch.save``'s bytes: tensors pickled
    by ``gather_object`` itself do not load back in this PyTorch."""
    if ranks.world == 1:
        return [value]
    buffer = io.BytesIO()
    torch.save(value, buffer)
    box: list[Any] = [None] * ranks.world if ranks.main else []
    dist.gather_object(buffer.getvalue(), box if ranks.main else None, dst=0)
    return [torch.load(io.BytesIO(data), weights_only=True) for data in box]
