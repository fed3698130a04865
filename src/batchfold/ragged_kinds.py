"""Which ops have a ragged form, and of which kind (see :mod:`batchfold.ragged`).

:func:`classify` decides whether a new signature can join a family: the family's kind
(``"rows"``, ``"elementwise"``, ``"mv"``, a segment reduction, ...), which of its inputs and
outputs have the ragged leading dimension, and the node's length. :func:`generic_pattern`
and :func:`member_pattern` find a call's ragged inputs and length from its input metas
alone, before the op runs.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .graph import Slot, TensorMeta
from .opbase import named
from .ops import ROWWISE, dim_arg

__all__ = ["MATMUL_OPS", "classify", "generic_pattern", "member_pattern"]

Tensor = torch.Tensor

_LINEAR = frozenset([F.linear])
MATMUL_OPS = frozenset([*named("matmul"), torch.Tensor.__matmul__])
"""``matmul`` in every spelling: ``torch.matmul``, ``Tensor.matmul`` and ``@``."""
_LAYER_NORM = frozenset([F.layer_norm])
_EMBEDDING = frozenset([F.embedding])
_DROPOUT = frozenset(named("dropout"))
_SOFTMAX = {f: f.__name__ for f in named("softmax", "log_softmax")}
_REDUCE = {f: f.__name__ for f in named("sum", "mean", "amax", "logsumexp")}
_CAT = frozenset(named("cat", "concat", "concatenate"))
_SQUEEZE = frozenset(named("squeeze", "unsqueeze"))
_TRANSPOSE = frozenset(named("transpose", "swapaxes"))
_DIM_KEYWORDS = frozenset(("dim", "dim0", "dim1", "axis0", "axis1"))  # theirs, by keyword
_UNFLATTEN = frozenset(named("unflatten"))
_FLATTEN = frozenset(named("flatten"))
_GETITEM = torch.Tensor.__getitem__
_STACK = frozenset(named("stack"))
# ops that act along the dims their dim argument names (at this position, or this default
# when left out), each row on its own when those dims leave dim 0 alone
_ALONG_DIM: dict[Any, tuple[int, Any]] = {
    **{f: (1, None) for f in named("cumsum", "cumprod", "argmax", "argmin", "var", "std")},
    **{f: (1, None) for f in named("max", "min")},
    **{f: (2, 0) for f in named("chunk", "split")},
    **{f: (2, None) for f in named("norm")},
    F.normalize: (2, 1),
}
_ALONG_DIM_KEYWORDS = frozenset(["dim", "keepdim", "dtype", "p", "eps", "correction", "out"])
_INDEX_SELECT = frozenset(named("index_select"))
_INDEX_ADD = frozenset(named("index_add"))
_CROSS_ENTROPY = frozenset([F.cross_entropy])
_RNN = frozenset(f for f in (torch.lstm, torch.gru, torch.rnn_tanh, torch.rnn_relu))


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
    joined = _rows_kind(func, template, in_metas, out_metas)
    if joined is not None:
        return joined
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
    if rule is ROWWISE and func not in MATMUL_OPS:
        shared = [a for a in (*args, *kwargs.values()) if isinstance(a, Tensor)]
        if any(t.dim() > rank or (t.dim() == rank and t.shape[0] != 1) for t in shared):
            return None
        return "elementwise"
    if func in _CAT:
        dim = dim_arg(args, kwargs, 1, 0)
        if not all(type(t) is Slot for t in args[0]):  # a shared tensor fixes the length
            return None
        return "rows" if type(dim) is int and dim % rank != 0 else None
    if func in _STACK:  # stack(rows, dim): a new dim after the rows
        dim = dim_arg(args, kwargs, 1, 0)
        if not all(type(t) is Slot for t in args[0]):
            return None
        return "rows" if type(dim) is int and dim % (rank + 1) != 0 else None
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
    if func in MATMUL_OPS:
        return _matmul_kind(args, metas, rank)
    if func in _SOFTMAX or func in _REDUCE:
        return _dim_kind(func, args, kwargs, metas, rank)
    if len(metas) != 1:
        return None
    if func in _ALONG_DIM:
        return "rows" if _along_other_dims(func, args, kwargs, rank) else None
    if func in _SQUEEZE or func in _TRANSPOSE:
        if not _DIM_KEYWORDS.issuperset(kwargs):
            return None
        dims = (*args[1:], *kwargs.values())  # x.transpose(1, dim1=0) names dim 0 too
        out_rank = rank + 1 if func.__name__ == "unsqueeze" else rank
        fine = dims and all(isinstance(d, int) and d % out_rank != 0 for d in dims)
        return "rows" if fine else None
    if func is _GETITEM and len(args) == 2:
        if type(args[1]) is int:  # x[-1], x[0]: the same row of every node
            return "pick_at"
        return "rows" if _rowwise_index(args[1], rank) else None
    if func in _UNFLATTEN or func in _FLATTEN:
        return _reshape_kind(func, args, kwargs, rank)
    return None


def _along_other_dims(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], rank: int) -> bool:
    """Whether an op of :data:`_ALONG_DIM` acts along named dims that leave dim 0 alone
    (``h.chunk(4, -1)``, ``h.var(-1)``, ``F.normalize(h, dim=-1)``, ``logits.argmax(-1)``);
    a bool where the dim would be (``var(x, True)``) or no dim is a reduction of everything."""
    if not _ALONG_DIM_KEYWORDS.issuperset(kwargs):
        return False
    at, default = _ALONG_DIM[func]
    dim = dim_arg(args, kwargs, at, default)
    dims = dim if type(dim) in (tuple, list) else (dim,)
    return bool(dims) and all(type(d) is int and d % rank != 0 for d in dims)


def _reshape_kind(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], rank: int
) -> str | None:
    """``x.unflatten(d, sizes)`` and ``x.flatten(start, end)`` that leave dim 0 alone: the same
    call on the packed rows."""
    if func in _UNFLATTEN:
        dims = [dim_arg(args, kwargs, 1, None)]
    else:
        start = kwargs.get("start_dim", args[1] if len(args) > 1 else 0)
        end = kwargs.get("end_dim", args[2] if len(args) > 2 else -1)
        dims = [start, end]
    if not all(isinstance(d, int) and -rank <= d < rank and d % rank != 0 for d in dims):
        return None
    return "rows"


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
        if index.dtype != torch.int64 or len(index.shape) > 1 or not rows.shape:
            return None
        if not index.shape:  # x[i], one row per node (a position read per instance)
            return ("pick", (True, False), (False,), rows.shape[0]) if func is _GETITEM else None
        return "index_rows", (True, True), (True,), index.shape[0]
    if len(args) != 4 or args[1] != 0 or type(args[2]) is not Slot or len(in_metas) != 3:
        return None
    out, index, source = in_metas
    if index.dtype != torch.int64 or len(index.shape) != 1 or not out.shape:
        return None
    if source.shape[1:] != out.shape[1:] or source.shape[:1] != index.shape:
        return None
    return "index_add", (True, True, True), (True,), out.shape[0]


def _rows_kind(
    func: Any,
    template: tuple[Any, Any],
    in_metas: tuple[TensorMeta, ...],
    out_metas: tuple[TensorMeta, ...],
) -> tuple[str, tuple[bool, ...], tuple[bool, ...], int] | None:
    """Rows sliced or joined along the leading dimension: ``x[a:b]`` and ``cat(xs, 0)``.

    The node's length is the output's; each input keeps its own (a secondary input).
    """
    args, kwargs = template
    if not out_metas or not out_metas[0].shape:
        return None
    if func is _GETITEM and len(args) == 2 and type(args[0]) is Slot and not kwargs:
        s = args[1]
        plain = type(s) is slice and all(
            type(b) in (type(None), int) for b in (s.start, s.stop, s.step)
        )
        if plain and s.step in (None, 1) and len(in_metas) == 1:
            return "slice_rows", (True,), (True,), out_metas[0].shape[0]
        return None
    if func in _CAT and args and all(type(t) is Slot for t in args[0]):
        rank = len(in_metas[0].shape)
        if rank and all(len(m.shape) == rank for m in in_metas):
            dim = dim_arg(args, kwargs, 1, 0)
            if type(dim) is int and dim % rank == 0:
                return "cat_rows", (True,) * len(in_metas), (True,), out_metas[0].shape[0]
    return None


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
    if func in _SOFTMAX and metas[0].dtype in (torch.float16, torch.bfloat16):
        return None  # the segment softmax rounds otherwise than eager's (a few units in the last place)
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
