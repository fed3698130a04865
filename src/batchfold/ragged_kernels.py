"""Running a ragged step: one packed call over nodes of different lengths (see
:mod:`batchfold.ragged`).

:func:`run_family` runs a family's op once on packed rows, ``[sum L, *rest]``: as it is for
row-wise ops, as segment operations (``index_add`` over each node's rows) for reductions over
the leading dimension, as one padded ``bmm`` or a scatter for block-diagonal products, and as
one ``PackedSequence`` call for recurrent layers. :func:`expand_rows` lists the packed rows
of a set of nodes.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .graph import Signature, Slot
from .opbase import call_one, scalar_kept_wide, zero_d_casts
from .ops_views import packed_rows

__all__ = ["expand_rows", "run_family"]

Tensor = torch.Tensor


def expand_rows(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The row indices ``starts[i] .. starts[i] + lengths[i] - 1`` of every i, in order."""
    total = int(lengths.sum())
    before = np.cumsum(lengths) - lengths
    return np.repeat(starts - before, lengths) + np.arange(total, dtype=np.int64)


def run_family(
    sig: Signature,
    inputs: list[Tensor],
    lengths: np.ndarray,
    sizes: dict[int, np.ndarray] | None = None,
) -> tuple[Tensor, ...]:
    """One packed call of ``sig``'s family over nodes of ``lengths`` rows each.

    Ragged inputs are packed ``[sum L, *rest]``, the others ``[n, *shape]``; ragged outputs
    come back packed, the others ``[n, *shape]``. ``sizes`` holds each node's length in the
    family's secondary inputs.
    """
    family = sig.family
    assert family is not None
    kind, n = family.kind, len(lengths)
    if kind in _PRODUCTS:
        dtype = inputs[-1].dtype
        if dtype == torch.bool:  # as eager's matmul, which has no kernel for it
            raise NotImplementedError(f"{sig.name} of bool tensors is not implemented")
        if dtype in _LOW:  # eager's matmul adds half-precision products up in float32
            wide = run_family(sig, [x.float() for x in inputs], lengths, sizes)
            return tuple(x.to(dtype) for x in wide)
    if kind == "macro":
        return family.replay(inputs, lengths, sizes or {})
    if kind == "rows":  # no segment ids needed: the op as it is on the packed rows
        out = call_one(sig, inputs)
        return tuple(out) if sig.multi else (out,)
    if kind not in _OWN_INDEX:  # each packed row's node
        segment = torch.from_numpy(np.repeat(np.arange(n, dtype=np.int64), lengths))
        segment = segment.to(inputs[0].device)
    else:
        segment = torch.empty(0, dtype=torch.int64)  # the indexing kinds make their own
    if kind == "elementwise":
        rank = max(len(m.shape) for m in sig.in_metas)
        args = list(inputs)
        casts = zero_d_casts(sig)
        wide = bool(casts) and scalar_kept_wide(sig, casts)  # then all at float32, as eager
        if wide:
            args = [x.float() for x in args]
        for i, dtype in () if wide else casts:
            args[i] = args[i].to(dtype)
        for i, ragged in enumerate(family.ragged_in):
            if not ragged:  # one value per node: repeated for its rows, lined up on the right
                x = args[i].index_select(0, segment)
                args[i] = x.reshape(len(x), *(1,) * (rank - x.dim()), *x.shape[1:])
        out = call_one(sig, args)
        if wide:
            out = out.to(sig.out_metas[0].dtype)
    elif kind == "mv":
        rows, vector = inputs
        out = (rows * vector.index_select(0, segment)).sum(-1).to(rows.dtype)  # int32 stays
    elif kind == "weighted":
        weights, rows = inputs
        out = _segment_sum(weights.unsqueeze(-1) * rows, segment, n)
    elif kind == "blockdiag":
        out = _block_diagonal(inputs[0], inputs[1], lengths)
    elif kind == "rnn":
        return _packed_rnn(sig, inputs, lengths)
    elif kind.startswith("cross_entropy"):
        logits, target = inputs
        ignore = sig.template[1].get("ignore_index", -100)
        if logits.dtype in _LOW:  # eager adds half-precision rows up its own way: its call
            return (_each_instance(logits, target, lengths, kind[14:], ignore),)
        rows = F.cross_entropy(logits, target, reduction="none", ignore_index=ignore)
        out = _segment_sum(rows, segment, n)
        if kind == "cross_entropy_mean":
            counted = (target != ignore).to(rows.dtype)
            out = out / _segment_sum(counted, segment, n)
    elif kind == "index_rows":
        assert sizes is not None
        rows, index = inputs
        negative = (
            sig.func is torch.Tensor.__getitem__
        )  # x[i] counts from the end; index_select not
        out = rows.index_select(0, packed_rows(sig, index, lengths, sizes[0], negative))
    elif kind == "slice_rows":
        assert sizes is not None
        rows = sizes[0]
        start = _slice_start(sig.template[0][1], rows) + np.cumsum(rows) - rows
        index = torch.from_numpy(expand_rows(start, lengths)).to(inputs[0].device)
        out = inputs[0].index_select(0, index)
    elif kind == "cat_rows":
        assert sizes is not None
        counts = np.stack([sizes[j] for j in range(len(inputs))], axis=1)  # [n, inputs]
        firsts = np.cumsum(counts, axis=0) - counts  # each piece's row in its input
        firsts += np.cumsum([0] + [len(x) for x in inputs[:-1]])  # ... in their concatenation
        index = expand_rows(firsts.ravel(), counts.ravel())  # node after node, pieces in order
        out = torch.cat(inputs).index_select(0, torch.from_numpy(index).to(inputs[0].device))
    elif kind == "pick_at" or kind == "pick":  # x[-1] of every node; x[i] with i per node
        rows = inputs[0]
        at = torch.full((n,), sig.template[0][1]) if kind == "pick_at" else inputs[1]
        ones = np.ones(n, dtype=np.int64)
        out = rows.index_select(0, packed_rows(sig, at.to(rows.device), ones, lengths, True))
    elif kind == "index_add":
        assert sizes is not None
        target, index, source = inputs
        out = target.index_add(0, packed_rows(sig, index, sizes[1], lengths, False), source)
    else:
        out = _segment_reduce(kind, inputs[0], segment, lengths)
    return tuple(out) if sig.multi else (out,)


_OWN_INDEX = frozenset(
    ("index_rows", "slice_rows", "cat_rows", "pick_at", "pick", "index_add", "blockdiag", "rnn")
)
"""The kinds that index their rows themselves: :func:`run_family` makes them no segment ids."""


def _slice_start(s: slice, rows: np.ndarray) -> np.ndarray:
    """Where ``x[s]`` starts in each node's ``rows`` rows (step 1; Python's clamping)."""
    if s.start is None:
        return np.zeros_like(rows)
    if s.start >= 0:
        return np.minimum(s.start, rows)
    return np.maximum(rows + s.start, 0)


def _block_diagonal(blocks: Tensor, rows: Tensor, lengths: np.ndarray) -> Tensor:
    """``A_i @ B_i`` for every node: ``blocks`` holds each ``A_i`` ``[L, L]`` flat, ``rows``
    each ``B_i`` packed.

    As one ``bmm`` with every ``A_i`` and ``B_i`` padded to the longest, unless that takes
    more memory than scaling one row of ``B_i`` by each entry of ``A_i`` (when one instance
    is far longer than the rest): the padded form runs several times faster, backward
    included, on molecule-sized blocks.
    """
    squares = lengths * lengths
    n, longest = len(lengths), int(lengths.max(initial=0))
    width = math.prod(rows.shape[1:])
    within = np.arange(int(squares.sum()), dtype=np.int64) - np.repeat(
        np.cumsum(squares) - squares, squares
    )
    side = np.maximum(np.repeat(lengths, squares), 1)
    row, column = within // side, within % side
    if n * longest * (longest + 2 * width) <= len(within) * (width + 2):
        starts = np.arange(n, dtype=np.int64) * longest
        at = np.repeat(starts * longest, squares) + row * longest + column
        padded = blocks.new_zeros(n * longest * longest)
        padded = padded.index_copy(0, torch.from_numpy(at).to(rows.device), blocks)
        offsets = np.cumsum(lengths) - lengths
        slots = np.repeat(starts - offsets, lengths) + np.arange(len(rows), dtype=np.int64)
        slots_t = torch.from_numpy(slots).to(rows.device)
        flat = rows.reshape(len(rows), width)
        others = flat.new_zeros(n * longest, width).index_copy(0, slots_t, flat)
        product = torch.bmm(padded.view(n, longest, longest), others.view(n, longest, width))
        return product.view(n * longest, width).index_select(0, slots_t).view(rows.shape)
    base = np.repeat(np.cumsum(lengths) - lengths, squares)
    target = torch.from_numpy(base + row).to(rows.device)
    source = torch.from_numpy(base + column).to(rows.device)
    picked = rows.index_select(0, source)
    weight = blocks.view(-1, *(1,) * (rows.dim() - 1))
    return rows.new_zeros(rows.shape).index_add(0, target, weight * picked)


def _packed_rnn(sig: Signature, inputs: list[Tensor], lengths: np.ndarray) -> tuple[Tensor, ...]:
    """A recurrent layer over sequences of different lengths as one ``PackedSequence`` call."""
    if not lengths.all():  # eager's error, where a sequence of 0 rows runs alone
        raise RuntimeError("Expected sequence length to be larger than 0 in RNN")
    args = sig.template[0]
    order = np.argsort(-lengths, kind="stable")  # longest first, as packed sequences want
    batch_sizes = (lengths[order][None, :] > np.arange(int(lengths.max()))[:, None]).sum(1)
    starts = np.cumsum(lengths) - lengths
    within = np.arange(int(lengths.sum())) - np.repeat(
        np.cumsum(batch_sizes) - batch_sizes, batch_sizes
    )
    time = np.repeat(np.arange(len(batch_sizes)), batch_sizes)
    rows = torch.from_numpy(starts[order][within] + time).to(inputs[0].device)
    data = inputs[0].squeeze(1).index_select(0, rows)
    device_order = torch.from_numpy(order).to(data.device)
    given, states = iter(inputs[1:]), []
    for state in args[1] if type(args[1]) in (tuple, list) else (args[1],):
        if type(state) is Slot:  # [n, layers, 1, hidden] -> [layers, n, hidden], sorted
            states.append(next(given).squeeze(2).transpose(0, 1).index_select(1, device_order))
        else:  # a state from outside the function, [layers, 1, hidden]: every sequence's
            states.append(state.expand(state.shape[0], len(lengths), *state.shape[2:]))
    hx: Any = tuple(states) if type(args[1]) in (tuple, list) else states[0]
    out, *final = sig.func(
        data, torch.from_numpy(batch_sizes), hx, args[2], *args[3:8]
    )  # the packed form: (data, batch_sizes, hx, params, bias, layers, dropout, train, bidir)
    unsort = torch.from_numpy(np.argsort(order)).to(data.device)
    packed = out.index_select(0, torch.from_numpy(np.argsort(rows.cpu().numpy())).to(data.device))
    return (
        packed.unsqueeze(1),
        *(h.index_select(1, unsort).transpose(0, 1).unsqueeze(2) for h in final),
    )


_LOW = (torch.float16, torch.bfloat16)  # eager PyTorch sums these in float32
_PRODUCTS = frozenset(("mv", "weighted", "blockdiag"))  # matmuls of per-instance values
_WIDE_SUMS = frozenset(("sum", "mean", "sum_all", "mean_all"))


def _segment_sum(x: Tensor, segment: Tensor, n: int) -> Tensor:
    """Each segment's rows added up; half-precision rows in float32, rounded once at the end,
    as eager sums are (added up in bfloat16, 1,000 ones make 256)."""
    if x.dtype in _LOW:
        wide = x.new_zeros((n, *x.shape[1:]), dtype=torch.float32)
        return wide.index_add(0, segment, x.float()).to(x.dtype)
    return x.new_zeros((n, *x.shape[1:])).index_add(0, segment, x)


def _segment_max(x: Tensor, segment: Tensor, n: int) -> Tensor:
    index = segment.view(-1, *(1,) * (x.dim() - 1)).expand_as(x)
    empty = x.new_full((n, *x.shape[1:]), float("-inf"))
    return empty.scatter_reduce(0, index, x, "amax", include_self=False)


def _segment_reduce(kind: str, x: Tensor, segment: Tensor, lengths: np.ndarray) -> Tensor:
    if x.dtype in _LOW and kind in _WIDE_SUMS:  # eager adds half precision up in float32
        return _segment_reduce(kind, x.float(), segment, lengths).to(x.dtype)  # one rounding
    n = len(lengths)
    if kind == "sum_all" or kind == "mean_all":
        per_row = x.reshape(len(x), math.prod(x.shape[1:])).sum(1)  # -1 fails on 0 rows
        total = _segment_sum(per_row, segment, n)
        if kind == "sum_all":
            return total
        count = torch.from_numpy(lengths * (x[0].numel() if len(x) else 0)).to(x.device, x.dtype)
        return total / count
    if kind == "sum":
        return _segment_sum(x, segment, n)
    if kind == "mean":
        count = torch.from_numpy(lengths).to(x.device, x.dtype)
        return _segment_sum(x, segment, n) / count.view(-1, *(1,) * (x.dim() - 1))
    if kind == "amax":
        return _segment_max(x, segment, n)
    top = _segment_max(x.detach(), segment, n)
    # As eager: logsumexp shifts by no infinite top (an +inf row gives +inf); softmax shifts
    # by +inf too (every entry of that column NaN), and by 0 for a column of -inf (0 / 0)
    infinite = ~torch.isfinite(top) if kind == "logsumexp" else top == -math.inf
    top = torch.where(infinite, torch.zeros_like(top), top)
    shifted = x - top.index_select(0, segment)
    total = _segment_sum(shifted.exp(), segment, n)
    if kind == "logsumexp":
        return total.log() + top
    if kind == "softmax":
        return shifted.exp() / total.index_select(0, segment)
    return shifted - total.log().index_select(0, segment)  # log_softmax


def _each_instance(
    logits: Tensor, target: Tensor, lengths: np.ndarray, reduction: str, ignore: int
) -> Tensor:
    """Each instance's ``F.cross_entropy`` over its own rows, one call each: in half
    precision eager sums the row losses in an order and at a precision of its own, and a
    sum of the rows' losses differed from it in the last place."""
    ends = lengths.cumsum().tolist()
    return torch.stack(
        [
            F.cross_entropy(logits[a:b], target[a:b], reduction=reduction, ignore_index=ignore)
            for a, b in zip([0, *ends[:-1]], ends, strict=True)
        ]
    )
