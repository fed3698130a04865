"""Batching rules for indexing and views: ``x[...]`` (basic indexing, or a per-instance
position), ``reshape`` and its kin, ``expand`` and ``transpose``/``permute``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .graph import Signature, Slot, TensorMeta
from .opbase import RULES, OpRule, lift, named, register

Tensor = torch.Tensor


def shift_dim(dim: Any, rank: int) -> Any:
    """A per-instance dim (or dims) of a rank-``rank`` value, as a dim of the batch."""
    if isinstance(dim, (tuple, list)):
        return tuple(d % rank + 1 for d in dim)
    return dim % rank + 1


def packed_rows(
    sig: Signature, index: Tensor, owner: Tensor, rows: np.ndarray, allow_negative: bool
) -> Tensor:
    """Per-instance row indices (``index[k]`` a row of instance ``owner[k]``, which has
    ``rows[owner[k]]`` rows) as indices into all instances' rows one after the other; an
    index out of range is eager's ``IndexError``, naming the op's line."""
    count = torch.from_numpy(rows).to(index.device).index_select(0, owner)
    low = -count if allow_negative else torch.zeros_like(count)
    bad = (index < low) | (index >= count)
    if len(index) and bool(bad.any()):
        k = int(bad.nonzero()[0, 0])
        raise IndexError(
            f"{sig.name} at {sig.site}: index {int(index[k])} is out of range for an instance "
            f"with {int(count[k])} rows (as eager PyTorch refuses it)"
        )
    start = torch.from_numpy(np.cumsum(rows) - rows).to(index.device).index_select(0, owner)
    return torch.where(index < 0, index + count, index) + start


def _plain_index(
    args: tuple[Any, ...], kwargs: dict[str, Any], metas: tuple[TensorMeta, ...]
) -> bool:
    if type(args[1]) is Slot:  # x[i], a per-instance 0-d int64 tensor i (see lazy.sources)
        if type(args[0]) is not Slot or len(metas) != 2:
            return False
        x, i = metas
        return len(x.shape) > 0 and i.shape == () and i.dtype == torch.int64
    index = args[1] if isinstance(args[1], tuple) else (args[1],)
    return type(args[0]) is Slot and all(
        i is None or i is Ellipsis or type(i) in (int, slice) for i in index
    )


def batched_getitem(sig: Signature, inputs: list[Tensor], n: int) -> Any:
    """``x[i, 1:3, None]`` per instance is ``x[:, i, 1:3, None]`` over the batch; ``x[i]``
    with a per-instance 0-d index ``i`` picks row ``i[k]`` of each ``x[k]``."""
    x, index = sig.template[0]
    if type(index) is Slot:
        rows = inputs[x.index]
        size = rows.shape[1]
        flat = rows.reshape(n * size, *rows.shape[2:])  # row at[k] of each x[k], in one call
        owner = torch.arange(n, device=rows.device)
        at = inputs[index.index].to(rows.device)  # eager takes a CPU index
        return flat.index_select(0, packed_rows(sig, at, owner, np.full(n, size), True))
    return inputs[0][(slice(None),) + (index if isinstance(index, tuple) else (index,))]


RULES[torch.Tensor.__getitem__] = OpRule(
    "getitem", batched_getitem, True, _plain_index, user_errors=(IndexError,)
)


def batched_reshape(sig: Signature, inputs: list[Tensor], n: int) -> Any:
    """Ops that only regroup elements: reshape the batch to the known output shape."""
    return inputs[0].reshape(n, *sig.out_metas[0].shape)


register(
    named("reshape", "view", "flatten", "squeeze", "unsqueeze", "ravel", "view_as", "reshape_as"),
    OpRule("reshape", batched_reshape, cheap=True, applies=lambda a, k, m: type(a[0]) is Slot),
)


def batched_expand(sig: Signature, inputs: list[Tensor], n: int) -> Any:
    """``expand``/``broadcast_to``: lift to the output rank, then expand behind the batch dim."""
    shape = sig.out_metas[0].shape
    return lift(inputs[0], len(shape)).expand(n, *shape)


register(
    named("expand", "expand_as", "broadcast_to"),
    OpRule("expand", batched_expand, cheap=True, applies=lambda a, k, m: type(a[0]) is Slot),
)


def batched_transpose(sig: Signature, inputs: list[Tensor], n: int) -> Any:
    """``transpose``/``t``/``permute`` with every per-instance dim moved one place right."""
    args, _ = sig.template
    rank = len(sig.in_metas[0].shape)
    x = inputs[0]
    if sig.func in (torch.t, torch.Tensor.t):
        return x if rank < 2 else x.transpose(1, 2)
    if sig.func in (torch.permute, torch.Tensor.permute):
        dims = args[1] if len(args) == 2 and isinstance(args[1], (tuple, list)) else args[1:]
        return x.permute(0, *shift_dim(tuple(dims), rank))
    return x.transpose(shift_dim(args[1], rank), shift_dim(args[2], rank))


register(
    named("t", "transpose", "swapaxes", "permute"),
    OpRule("transpose", batched_transpose, True, lambda a, k, m: type(a[0]) is Slot and not k),
)
