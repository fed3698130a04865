"""Ragged batching: nodes whose per-instance shapes differ only in their leading dimension.

Two nodes batch together when their signatures are equal, which needs equal shapes. A
*family* joins the signatures of one op whose per-instance inputs differ only in the length
``L`` of their leading dimension (a sentence's ``[T, d]`` states, a molecule's ``[atoms, d]``
features), where the op treats that dimension row by row or reduces over it. The scheduler
groups a family's nodes as one signature's; a step whose nodes have different lengths holds
each ragged value *packed*: the rows of all its nodes concatenated, ``[sum L, *rest]``, with
offsets. Row-wise ops (elementwise, ``linear``, ``x @ W``, ``layer_norm``, ``embedding``,
dropout, softmax and reductions over other dims, ``cat`` along other dims) run once on the
packed rows; reductions over the leading dimension (``sum``, ``mean``, ``amax``,
``logsumexp``, ``softmax``, ``log_softmax``, ``w @ H``) run as segment operations. Memory
grows with the total number of rows, never with batch x longest instance.

Every other op batches by exact shape, as before; values move between packed and per-shape
steps through the executor's gathers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .graph import Signature, Slot, TensorMeta
from .opbase import call_one, named
from .ops import ROWWISE, dim_arg, zero_d_casts

Tensor = torch.Tensor

_LINEAR = frozenset([F.linear])
_MATMUL = frozenset([*named("matmul"), torch.Tensor.__matmul__])
_LAYER_NORM = frozenset([F.layer_norm])
_EMBEDDING = frozenset([F.embedding])
_DROPOUT = frozenset(named("dropout"))
_SOFTMAX = {f: f.__name__ for f in named("softmax", "log_softmax")}
_REDUCE = {f: f.__name__ for f in named("sum", "mean", "amax", "logsumexp")}
_CAT = frozenset(named("cat", "concat", "concatenate"))
_SQUEEZE = frozenset(named("squeeze", "unsqueeze"))
_TRANSPOSE = frozenset(named("transpose", "swapaxes"))
_GETITEM = torch.Tensor.__getitem__
_INDEX_SELECT = frozenset(named("index_select"))
_INDEX_ADD = frozenset(named("index_add"))
_CROSS_ENTROPY = frozenset([F.cross_entropy])
_RNN = frozenset(f for f in (torch.lstm, torch.gru, torch.rnn_tanh, torch.rnn_relu))


@dataclass(frozen=True, slots=True)
class Family:
    """The signatures of one op that batch across leading-dimension lengths.

    ``kind`` is ``"rows"`` (the op runs on the packed rows as it is), ``"elementwise"`` (the
    same, after per-instance inputs without the leading dim are repeated for every row),
    ``"mv"`` (``[L, d] @ [d]``), ``"macro"`` (a module call's traced ops, see
    ``lazy.ragged_macros``), ``"weighted"`` (``[L] @ [L, d]``), ``"blockdiag"``
    (``[L, L] @ [L, d]`` or ``[L, L] @ [L]``: an adjacency times states), a segment reduction
    (``"sum"``, ``"mean"``, ``"amax"``, ``"logsumexp"``, ``"softmax"``, ``"log_softmax"``)
    or ``"source"`` (per-instance tensors to concatenate). ``ragged_in`` and ``ragged_out``
    say which inputs and outputs have the ragged leading dim; ``rep`` is the first member's
    signature id, which the scheduler groups by.
    """

    id: int
    kind: str
    ragged_in: tuple[bool, ...]
    ragged_out: tuple[bool, ...]
    rep: int
    square: int = -1  # "blockdiag": the input that is [L, L] per node, gathered flat
    outs: tuple[TensorMeta, ...] = ()  # the first member's output metas
    secondary: tuple[int, ...] = ()  # ragged inputs whose length is not the node's
    replay: Any = None  # "macro": runs a traced module call's ops on packed inputs


def ragged_meta(meta: TensorMeta) -> tuple[Any, ...]:
    """A meta's place in a family key: everything but the length of its leading dim."""
    return ("ragged", meta.shape[1:], meta.dtype, meta.device)


def family_key(key: Any, ragged_in: tuple[bool, ...], square: int = -1) -> Any:
    """``key`` with the meta of every ragged input replaced by its :func:`ragged_meta`.

    A signature key holds its inputs' metas in input order. The ``square`` input
    (``[L, L]``) keeps only its dtype and device.
    """
    count = [0]

    def replace(part: tuple[Any, ...]) -> tuple[Any, ...]:
        out = []
        for item in part:
            kind = type(item)
            if kind is TensorMeta:
                i = count[0]
                count[0] = i + 1
                if i == square:
                    item = ("square", item.dtype, item.device)
                elif ragged_in[i]:
                    item = ("ragged", item.shape[1:], item.dtype, item.device)
            elif kind is tuple:
                item = replace(item)
            out.append(item)
        return tuple(out)

    return replace(key)


def classify(
    func: Any,
    rule: Any,
    template: tuple[Any, Any],
    in_metas: tuple[TensorMeta, ...],
    out_metas: tuple[TensorMeta, ...],
) -> tuple[str, tuple[bool, ...], tuple[bool, ...], int] | None:
    """Whether a new signature can join a family: its kind, ragged inputs and outputs, length.

    ``None`` when the op has no ragged form, or its per-instance shapes do not fit one.
    """
    if not in_metas:
        return None
    if func in _RNN:
        return _rnn_kind(template[0], in_metas, out_metas)
    by_index = func is _GETITEM and len(template[0]) == 2 and type(template[0][1]) is Slot
    if func in _INDEX_SELECT or func in _INDEX_ADD or by_index:
        return _index_kind(func, template, in_metas)
    generic = generic_pattern(in_metas)
    if generic is None:
        return None
    ragged_in, length = generic
    rank = max(len(m.shape) for m in in_metas)
    args, kwargs = template
    kind = _kind(func, rule, args, kwargs, in_metas, ragged_in, rank)
    if kind is None:
        return None
    if kind in ("weighted", "blockdiag") or kind.startswith("cross_entropy"):
        ragged_in = (True, True)
    if kind in ("rows", "elementwise", "mv", "softmax", "log_softmax", "blockdiag"):
        if not all(m.shape and m.shape[0] == length for m in out_metas):
            return None
        ragged_out = (True,) * len(out_metas)
    else:
        ragged_out = (False,) * len(out_metas)
    if kind != "elementwise" and kind != "mv" and not all(ragged_in):
        return None
    return kind, ragged_in, ragged_out, length


def _kind(
    func: Any,
    rule: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    metas: tuple[TensorMeta, ...],
    ragged_in: tuple[bool, ...],
    rank: int,
) -> str | None:
    if rule is ROWWISE and func not in _MATMUL:
        shared = [a for a in (*args, *kwargs.values()) if isinstance(a, Tensor)]
        if any(t.dim() > rank or (t.dim() == rank and t.shape[0] != 1) for t in shared):
            return None
        return "elementwise"
    if func in _CAT:
        dim = dim_arg(args, kwargs, 1, 0)
        if not all(type(t) is Slot for t in args[0]):  # a shared tensor fixes the length
            return None
        return "rows" if type(dim) is int and dim % rank != 0 else None
    if type(args[0] if args else None) is not Slot:
        return None
    if func in _CROSS_ENTROPY:
        return _cross_entropy_kind(args, kwargs, metas)
    if func in _LINEAR or func in _EMBEDDING:
        return "rows" if (rank >= 2 or func in _EMBEDDING) and len(metas) == 1 else None
    if func in _DROPOUT:
        return "rows" if len(metas) == 1 else None
    if func in _LAYER_NORM:
        shape = args[1] if len(args) > 1 else kwargs.get("normalized_shape")
        if shape is None or len(metas) != 1:
            return None
        return "rows" if len(tuple(shape)) < rank else None
    if func in _MATMUL:
        return _matmul_kind(args, metas, rank)
    if func in _SOFTMAX or func in _REDUCE:
        return _dim_kind(func, args, kwargs, metas, rank)
    if len(metas) != 1:
        return None
    dims = args[1:] if not kwargs else (*args[1:], kwargs.get("dim"), kwargs.get("dim0"))
    if func in _SQUEEZE or func in _TRANSPOSE:
        out_rank = rank + 1 if func.__name__ == "unsqueeze" else rank
        fine = dims and all(isinstance(d, int) and d % out_rank != 0 for d in dims if d is not None)
        return "rows" if fine else None
    if func is _GETITEM and len(args) == 2:
        return "rows" if _rowwise_index(args[1], rank) else None
    return None


def _rnn_kind(
    args: tuple[Any, ...], in_metas: tuple[TensorMeta, ...], out_metas: tuple[TensorMeta, ...]
) -> tuple[str, tuple[bool, ...], tuple[bool, ...], int] | None:
    """``nn.LSTM``/``nn.GRU``/``nn.RNN`` on one unbatched sequence ``[L, 1, d]``."""
    if len(args) != 9 or type(args[0]) is not Slot or args[8] is not False:
        return None
    if any(isinstance(w, Slot) for w in args[2]) or len(in_metas[0].shape) != 3:
        return None
    if not all(len(m.shape) == 3 and m.shape[1] == 1 for m in (*in_metas, *out_metas)):
        return None
    ragged_out = (True,) + (False,) * (len(out_metas) - 1)
    return "rnn", (True,) + (False,) * (len(in_metas) - 1), ragged_out, in_metas[0].shape[0]


def _index_kind(
    func: Any, template: tuple[Any, Any], in_metas: tuple[TensorMeta, ...]
) -> tuple[str, tuple[bool, ...], tuple[bool, ...], int] | None:
    """Rows picked or summed by a per-instance index along dim 0: two lengths per node.

    ``x.index_select(0, i)`` and ``x[i]`` (``i`` int64 ``[P]``) give ``[P, *rest]``;
    ``out.index_add(0, i, src)`` adds the rows of ``src`` ``[P, *rest]`` into ``out``
    ``[A, *rest]``. The node's length is the output's; the other is kept per input.
    """
    args, kwargs = template
    if kwargs or not all(type(a) is Slot for a in (args[0], args[-1])) or len(in_metas) < 2:
        return None
    if func is _GETITEM or func in _INDEX_SELECT:
        if len(args) != (2 if func is _GETITEM else 3) or len(in_metas) != 2:
            return None
        if func is not _GETITEM and args[1] not in (0, -len(in_metas[0].shape)):
            return None
        rows, index = in_metas
        if index.dtype != torch.int64 or len(index.shape) != 1 or not rows.shape:
            return None
        return "index_rows", (True, True), (True,), index.shape[0]
    if len(args) != 4 or args[1] != 0 or type(args[2]) is not Slot or len(in_metas) != 3:
        return None
    out, index, source = in_metas
    if index.dtype != torch.int64 or len(index.shape) != 1 or not out.shape:
        return None
    if source.shape[1:] != out.shape[1:] or source.shape[:1] != index.shape:
        return None
    return "index_add", (True, True, True), (True,), out.shape[0]


def _rowwise_index(index: Any, rank: int) -> bool:
    """Whether ``x[index]`` keeps every row of dim 0, in order, and indexes only the others."""
    if type(index) is not tuple or not index:
        return False
    plain = all(type(i) in (int, slice) for i in index[1:])
    if index[0] == slice(None) and plain:
        return True
    return index[0] is Ellipsis and plain and len(index) - 1 < rank


def _cross_entropy_kind(
    args: tuple[Any, ...], kwargs: dict[str, Any], metas: tuple[TensorMeta, ...]
) -> str | None:
    """``F.cross_entropy`` of ``[L, C]`` logits and ``[L]`` class indices, summed or averaged
    over the rows: per-row losses on the packed rows, then a segment sum."""
    if len(args) != 2 or type(args[1]) is not Slot or len(metas) != 2:
        return None
    logits, target = metas
    if len(logits.shape) != 2 or target.shape != logits.shape[:1] or target.dtype != torch.int64:
        return None
    plain = {"weight": None, "size_average": None, "reduce": None, "label_smoothing": 0.0}
    if any(kwargs.get(name, value) != value for name, value in plain.items()):
        return None
    if set(kwargs) - {*plain, "reduction", "ignore_index"}:
        return None
    reduction = kwargs.get("reduction", "mean")
    return f"cross_entropy_{reduction}" if reduction in ("sum", "mean") else None


def _matmul_kind(args: tuple[Any, ...], metas: tuple[TensorMeta, ...], rank: int) -> str | None:
    if len(args) != 2:
        return None
    other = args[1]
    if isinstance(other, Tensor):  # x @ W, W shared
        return "rows" if rank >= 2 and other.dim() in (1, 2) else None
    if type(other) is not Slot or len(metas) != 2:
        return None
    a, b = metas
    if len(a.shape) == 2 and a.shape[0] == a.shape[1] == b.shape[0]:
        return "blockdiag"
    if len(a.shape) == 2 and len(b.shape) == 1:
        return "mv"
    if len(a.shape) == 1 and len(b.shape) == 2 and a.shape[0] == b.shape[0]:
        return "weighted"
    return None


def _dim_kind(
    func: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    metas: tuple[TensorMeta, ...],
    rank: int,
) -> str | None:
    if len(metas) != 1 or not metas[0].dtype.is_floating_point:
        return None
    if set(kwargs) - {"dim", "_stacklevel", "dtype", "keepdim"} or kwargs.get("dtype") is not None:
        return None
    if kwargs.get("keepdim") or (len(args) > 2 and args[2] is not False):
        return None
    dim = dim_arg(args, kwargs, 1, None)
    if dim is None and len(args) == 1 and not kwargs and func in _REDUCE:
        name = _REDUCE[func]  # over every element: a segment reduction of the flat rows
        return f"{name}_all" if name in ("sum", "mean") else None
    listed = dim if type(dim) in (tuple, list) else (dim,)
    if not listed or not all(isinstance(d, int) for d in listed):
        return None
    dims = {d % rank for d in listed if isinstance(d, int)}
    if 0 not in dims:
        return "rows"
    name = _SOFTMAX.get(func) or _REDUCE[func]
    return name if dims == {0} else None


# running a step whose nodes have different lengths ------------------------------------------


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
    if kind == "macro":
        return family.replay(inputs, lengths)
    segment = torch.from_numpy(np.repeat(np.arange(n, dtype=np.int64), lengths))
    segment = segment.to(inputs[0].device)
    if kind == "rows":
        out = call_one(sig, inputs)
    elif kind == "elementwise":
        rank = max(len(m.shape) for m in sig.in_metas)
        args = list(inputs)
        for i, dtype in zero_d_casts(sig):
            args[i] = args[i].to(dtype)
        for i, ragged in enumerate(family.ragged_in):
            if not ragged:  # one value per node: repeated for its rows, lined up on the right
                x = args[i].index_select(0, segment)
                args[i] = x.reshape(len(x), *(1,) * (rank - x.dim()), *x.shape[1:])
        out = call_one(sig, args)
    elif kind == "mv":
        rows, vector = inputs
        out = (rows * vector.index_select(0, segment)).sum(-1)
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
        rows = F.cross_entropy(logits, target, reduction="none", ignore_index=ignore)
        out = _segment_sum(rows, segment, n)
        if kind == "cross_entropy_mean":
            counted = (target != ignore).to(rows.dtype)
            out = out / _segment_sum(counted, segment, n)
    elif kind == "index_rows":
        assert sizes is not None
        rows, index = inputs
        index = _global_index(sig, index, segment, sizes[0], allow_negative=True)
        out = rows.index_select(0, index)
    elif kind == "index_add":
        assert sizes is not None
        target, index, source = inputs
        owner = np.repeat(np.arange(n, dtype=np.int64), sizes[1])
        owner_t = torch.from_numpy(owner).to(index.device)
        index = _global_index(sig, index, owner_t, lengths, allow_negative=False)
        out = target.index_add(0, index, source)
    else:
        out = _segment_reduce(kind, inputs[0], segment, lengths)
    return tuple(out) if sig.multi else (out,)


def _global_index(
    sig: Signature, index: Tensor, owner: Tensor, rows: np.ndarray, allow_negative: bool
) -> Tensor:
    """Per-instance row indices as indices into the packed rows; out of range is an error."""
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
    states = [h.squeeze(2).transpose(0, 1).index_select(1, device_order) for h in inputs[1:]]
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


def _segment_sum(x: Tensor, segment: Tensor, n: int) -> Tensor:
    return x.new_zeros((n, *x.shape[1:])).index_add(0, segment, x)


def _segment_max(x: Tensor, segment: Tensor, n: int) -> Tensor:
    index = segment.view(-1, *(1,) * (x.dim() - 1)).expand_as(x)
    empty = x.new_full((n, *x.shape[1:]), float("-inf"))
    return empty.scatter_reduce(0, index, x, "amax", include_self=False)


def _segment_reduce(kind: str, x: Tensor, segment: Tensor, lengths: np.ndarray) -> Tensor:
    n = len(lengths)
    if kind == "sum_all" or kind == "mean_all":
        per_row = x.reshape(len(x), -1).sum(1)
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
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    shifted = x - top.index_select(0, segment)
    total = _segment_sum(shifted.exp(), segment, n)
    if kind == "logsumexp":
        return total.log() + top
    if kind == "softmax":
        return shifted.exp() / total.index_select(0, segment)
    return shifted - total.log().index_select(0, segment)  # log_softmax


def join_family(families: dict[Any, Family], sig: Signature, key: Any) -> None:
    """Make ``sig`` (just made for ``key``) a member of its family, if it has one."""
    if sig.source is not None:
        meta = sig.out_metas[0]
        if sig.source != "tensor" or not meta.shape:
            return
        found = ("source", (), (True,), meta.shape[0])
        fkey: Any = ("source", ragged_meta(meta))
    else:
        found = classify(sig.func, sig.rule, sig.template, sig.in_metas, sig.out_metas)
        if found is None:
            return
        fkey = (found[0], family_key(key, found[1], 0 if found[0] == "blockdiag" else -1))
    kind, ragged_in, ragged_out, length = found
    family = families.get(fkey)
    if family is None:
        square = 0 if kind == "blockdiag" else -1
        secondary = {"index_rows": (0,), "index_add": (1, 2)}.get(kind, ())
        family = Family(
            len(families),
            kind,
            ragged_in,
            ragged_out,
            sig.id,
            square,
            sig.out_metas,
            secondary,
        )
        families[fkey] = family
        if (
            sig.source is None
            and (square < 0 or len(sig.in_metas[1].shape) == 2)
            and member_pattern(sig.func, _first_is_slot(sig), sig.in_metas) == (ragged_in, length)
        ):
            families[("member", family_key(key, ragged_in, square))] = family
    sig.family, sig.length, sig.pool = family, length, family.rep


def generic_pattern(in_metas: tuple[TensorMeta, ...]) -> tuple[tuple[bool, ...], int] | None:
    """Which inputs have the node's length ``L`` (those of the highest rank), and ``L``."""
    rank, length = 0, 0
    for m in in_metas:
        if len(m.shape) > rank:
            rank, length = len(m.shape), m.shape[0]
    if rank == 0:
        return None
    pattern = []
    for m in in_metas:
        top = len(m.shape) == rank
        if top and m.shape[0] != length:
            return None
        pattern.append(top)
    return tuple(pattern), length


def _first_is_slot(sig: Signature) -> bool:
    args = sig.template[0]
    return bool(args) and type(args[0]) is Slot


def member_pattern(
    func: Any, first_lazy: bool, in_metas: tuple[TensorMeta, ...]
) -> tuple[tuple[bool, ...], int] | None:
    """Which inputs of a call have the node's length, and the length, from the call alone:
    a recurrent layer's sequence (its first argument, lazy), else the inputs of the highest
    rank."""
    if func in _RNN:
        if not in_metas or len(in_metas[0].shape) != 3 or not first_lazy:
            return None
        return (True,) + (False,) * (len(in_metas) - 1), in_metas[0].shape[0]
    if func in _CROSS_ENTROPY and len(in_metas) == 2 and in_metas[0].shape:
        return (True, True), in_metas[0].shape[0]  # logits [L, C], classes [L]
    return generic_pattern(in_metas)


def member_of(
    families: dict[Any, Family],
    key: Any,
    func: Any,
    first_lazy: bool,
    in_metas: tuple[TensorMeta, ...],
) -> tuple[Family, int, tuple[TensorMeta, ...]] | None:
    """The family a new signature joins and its output metas, known without running the op.

    Only for a family whose ragged inputs are those :func:`member_pattern` finds, and a
    length of at least 1 (an op on 0 rows is run once, in case it refuses them as eager
    PyTorch does).
    """
    found = member_pattern(func, first_lazy, in_metas)
    if found is None or found[1] == 0:
        return None
    length = found[1]
    a = in_metas[0].shape
    # [L, L] @ [L, d]: an adjacency times states, keyed without the square's shape
    square = 0 if func in _MATMUL and a == (length, length) and len(in_metas) == 2 else -1
    family = families.get(("member", family_key(key, found[0], square)))
    if family is None:
        return None
    outs = tuple(
        TensorMeta.of((length, *m.shape[1:]), m.dtype, m.device) if ragged else m
        for m, ragged in zip(family.outs, family.ragged_out, strict=True)
    )
    return family, length, outs
