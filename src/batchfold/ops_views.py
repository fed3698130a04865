"""Batching rules for indexing and views: ``x[...]`` (basic indexing, or a per-instance
position), ``reshape`` and its kin, ``expand`` and ``transpose``/``permute``.
"""

from __future__ import annotations

import threading
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
    sig: Signature, index: Tensor, counts: np.ndarray, rows: np.ndarray, allow_negative: bool
) -> Tensor:
    """Per-instance row indices as indices into all instances' rows one after the other.

    ``index`` holds ``counts[i]`` entries of instance ``i``, each a row of that instance,
    which has ``rows[i]`` rows; an index out of range is eager's ``IndexError``, naming the
    op's line. One step often reads the same index several times (a molecule's pair atoms
    feed a gather and a scatter in every layer): the last few results are kept, each with
    its index (as long as it is unchanged) and the two arrays it was computed for.
    """
    memo = _ROWS_MEMO.__dict__.setdefault("entries", [])
    try:
        version = index._version
    except RuntimeError:  # an inference tensor has no version to tell a change by: not kept
        memo = []
        version = -1
    for entry in memo:
        if (
            entry[0] is index
            and entry[1] == version
            and entry[2] is counts
            and entry[3] is rows
            and entry[4] == allow_negative
        ):
            return entry[5]
    # in NumPy, on a GPU's index too: its bounds check waits for the values anyway, and ten
    # small ops each way cost more than the two copies
    found = _rows(sig, index.cpu().numpy(), counts, rows, allow_negative)
    out = torch.from_numpy(found).to(index.device)
    memo.insert(0, (index, version, counts, rows, allow_negative, out))
    del memo[_ROWS_KEPT:]
    return out


_ROWS_MEMO = threading.local()
_ROWS_KEPT = 4


def forget_rows() -> None:
    """Drop the kept results of :func:`packed_rows` (and the indices they hold) in this
    thread: the executor calls it when a plan has run."""
    _ROWS_MEMO.__dict__.pop("entries", None)


def _rows(
    sig: Signature, index: np.ndarray, counts: np.ndarray, rows: np.ndarray, allow_negative: bool
) -> np.ndarray:
    owner = np.repeat(np.arange(len(counts)), counts)
    count, given = rows[owner], index
    if allow_negative:
        index = np.where(index < 0, index + count, index)
    if index.size and (index.min() < 0 or (index >= count).any()):
        bad = (index < 0) | (index >= count)
        k = int(np.flatnonzero(bad)[0])
        raise IndexError(
            f"{sig.name} at {sig.site}: index {int(given[k])} is out of range for an instance "
            f"with {int(count[k])} rows (as eager PyTorch refuses it)"
        )
    return index + (np.cumsum(rows) - rows)[owner]


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
        at = inputs[index.index].to(rows.device)  # eager takes a CPU index
        return flat.index_select(
            0, packed_rows(sig, at, np.ones(n, np.int64), np.full(n, size), True)
        )
    return inputs[0][(slice(None),) + (index if isinstance(index, tuple) else (index,))]


RULES[torch.Tensor.__getitem__] = OpRule(
    "getitem", batched_getitem, True, _plain_index, user_errors=(IndexError,)
)


def _regroups(args: tuple[Any, ...], kwargs: dict[str, Any], metas: Any) -> bool:
    """A reshape of a per-instance tensor; not ``x.view(torch.int64)``, which reinterprets
    the elements' bytes (vmap's rule batches that)."""
    return type(args[0]) is Slot and not any(
        isinstance(a, torch.dtype) for a in (*args[1:], *kwargs.values())
    )


def batched_reshape(sig: Signature, inputs: list[Tensor], n: int) -> Any:
    """Ops that only regroup elements: reshape the batch to the known output shape."""
    return inputs[0].reshape(n, *sig.out_metas[0].shape)


register(
    named("reshape", "view", "flatten", "squeeze", "unsqueeze", "ravel", "view_as", "reshape_as"),
    OpRule("reshape", batched_reshape, cheap=True, applies=_regroups),
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
