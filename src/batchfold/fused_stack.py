"""One gather for a ``torch.stack`` step of many inputs (a per-instance list of losses, states
or children stacked).

A step gathers each input on its own: for ``torch.stack(losses)`` of ``m`` per-instance
values, ``m`` gathers, each a concatenation of the pieces of the steps that made that
position's values, permuted into the step's row order, and then ``torch.stack`` copies them
all again. With values made at many depths (a tree's node losses), that was thousands of small
calls a batch. Here the pieces of every input go into one concatenation and one permutation,
and the stacked tensor is a view of it: the same rows, in two calls.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from .graph import Signature, Slot
from .ops import dim_arg
from .plan import Gather, Step

Tensor = torch.Tensor

FUSE_AT = 3
"""Inputs from which a stack step's gathers are fused (two are as cheap one by one)."""

_STACK = torch.stack


def fusable(sig: Signature, n_gathers: int) -> bool:
    """Whether a step of ``sig`` stacks its own inputs alone, all of one meta, in order."""
    if n_gathers < FUSE_AT or sig.func is not _STACK or sig.family is not None:
        return False
    args, kwargs = sig.template
    if not args or type(args[0]) not in (list, tuple) or len(args[0]) != len(sig.in_metas):
        return False
    if any(type(s) is not Slot or s.index != i for i, s in enumerate(args[0])):
        return False  # a shared tensor in the list, or the values in another order
    if len(args) > 2 or set(kwargs) - {"dim"} or type(dim_arg(args, kwargs, 1, 0)) is not int:
        return False
    first = sig.in_metas[0]
    return all(meta is first for meta in sig.in_metas)


def fused_stack(
    sig: Signature, step: Step, n: int, pieces_of: Callable[[Gather], list[Tensor]]
) -> Tensor:
    """The batched ``torch.stack`` of ``step``'s inputs: ``[n, *shape]`` with the stacked dim
    inserted, from one ``torch.cat`` of every input's pieces and one permutation.

    ``pieces_of(gather)`` gives a gather's pieces before its ``order`` (the executor's).
    """
    m, shape = len(step.gathers), sig.in_metas[0].shape
    pieces: list[Tensor] = []
    order: list[np.ndarray] = []
    identity = True
    for j, gather in enumerate(step.gathers):
        pieces += pieces_of(gather)
        if gather.order is None:
            order.append(np.arange(j * n, (j + 1) * n))
        else:
            order.append(gather.order + j * n)
            identity = False
    with sig.grad_mode():
        rows = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
        if not identity:
            index = torch.from_numpy(np.concatenate(order)).to(rows.device, non_blocking=True)
            rows = rows.index_select(0, index)
        dim = dim_arg(*sig.template, 1, 0) % (len(shape) + 1)
        return rows.view(m, n, *shape).movedim(0, dim + 1)
