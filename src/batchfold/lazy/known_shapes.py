"""Output shapes of common ops without running them: linear, embedding, matmul, dropout and
the recurrent layers.

Their meta kernels' first use imports ``torch._dynamo`` (a fifth of a second to seconds),
which would make every process's first ``batch_map`` slow; the weights of linear, embedding
and recurrent layers are too large to run them on zeros instead, and dropout on zeros would
draw from the user's generator. Anything else is left to :mod:`.inference`'s meta run.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..graph import Slot, TensorMeta
from ..ragged_kinds import MATMUL_OPS

Tensor = torch.Tensor

_INDEX_DTYPES = (torch.int64, torch.int32)
_RNNS = frozenset([torch.lstm, torch.gru, torch.rnn_tanh, torch.rnn_relu])
_DROPOUTS = frozenset([F.dropout, F.alpha_dropout, F.feature_alpha_dropout, torch.dropout])


def known_shape(func: Any, targs: Any, tkwargs: Any, in_metas: tuple[TensorMeta, ...]) -> Any:
    """The output (meta tensors) of ``F.linear``, ``F.embedding``, matmul, dropout or a
    recurrent layer without running it; ``None`` for any other call, or one whose arguments
    do not fit (the meta run then names the problem)."""
    if not targs or type(targs[0]) is not Slot:
        return None
    if func in _DROPOUTS and len(in_metas) == 1:  # out of place (in place is recorded apart)
        return torch.empty(in_metas[0].shape, dtype=in_metas[0].dtype, device="meta")
    if func in _RNNS:
        return _rnn_shapes(func, targs, in_metas)
    if func in MATMUL_OPS and len(targs) == 2 and not tkwargs:
        return _matmul_shape(targs, in_metas)
    if func is F.embedding:
        return _embedding_shape(targs, tkwargs, in_metas)
    if func is not F.linear or tkwargs or len(targs) not in (2, 3):
        return None
    weight, bias = targs[1], targs[2] if len(targs) == 3 else None
    meta = in_metas[0]
    if not isinstance(weight, Tensor) or weight.dim() != 2 or not meta.shape:
        return None
    if meta.shape[-1] != weight.shape[1] or meta.dtype != weight.dtype:
        return None
    if bias is not None and (not isinstance(bias, Tensor) or bias.shape != weight.shape[:1]):
        return None
    return torch.empty((*meta.shape[:-1], weight.shape[0]), dtype=meta.dtype, device="meta")


def _embedding_shape(targs: Any, tkwargs: Any, in_metas: tuple[TensorMeta, ...]) -> Any:
    """``F.embedding(index, weight)``: ``[*index.shape, dim]`` in the weight's dtype (a call
    with ``max_norm`` is refused before this, see ``semantics.refuse_unrecordable``)."""
    weight = targs[1] if len(targs) > 1 else tkwargs.get("weight")
    index = in_metas[0]
    if len(in_metas) != 1 or index.dtype not in _INDEX_DTYPES:
        return None
    if not isinstance(weight, Tensor) or weight.dim() != 2:
        return None
    return torch.empty((*index.shape, weight.shape[1]), dtype=weight.dtype, device="meta")


def _matmul_shape(targs: Any, in_metas: tuple[TensorMeta, ...]) -> Any:
    """``a @ b`` of a vector or matrix by a vector or matrix, or of a stack of matrices by a
    matrix: the output without the meta kernel; ``None`` for anything else or a mismatch."""
    a, b = (in_metas[t.index] if type(t) is Slot else t for t in targs)
    if not all(isinstance(t, (Tensor, TensorMeta)) for t in (a, b)) or a.dtype != b.dtype:
        return None
    if not a.dtype.is_floating_point:  # others (bool) may have no kernel: the meta run says so
        return None
    x, y = tuple(a.shape), tuple(b.shape)
    if not 1 <= len(y) <= 2 or len(x) < 1 or (len(x) > 2 and len(y) != 2):
        return None
    if x[len(x) - 1] != y[0]:
        return None
    shape = x[:-1] + y[1:]
    return torch.empty(shape, dtype=a.dtype, device="meta")


def _rnn_shapes(func: Any, targs: Any, in_metas: tuple[TensorMeta, ...]) -> Any:
    """``torch.lstm``/``gru``/``rnn_*`` on a padded batch ``[L, B, d]`` (``nn.LSTM`` & co.):
    the output ``[L, B, directions * h]`` and final states shaped as the initial ones, where
    the arguments fit together; ``None`` otherwise (the meta run then names the problem)."""
    if len(targs) != 9 or not isinstance(targs[2], (list, tuple)) or not targs[2]:
        return None
    x = in_metas[targs[0].index]
    states = tuple(targs[1]) if isinstance(targs[1], (list, tuple)) else (targs[1],)
    if len(states) != (2 if func is torch.lstm else 1) or len(x.shape) != 3:
        return None
    shapes = []
    for state in states:
        meta = in_metas[state.index] if type(state) is Slot else state
        if not isinstance(meta, (Tensor, TensorMeta)) or meta.dtype != x.dtype:
            return None
        shapes.append(tuple(meta.shape))
    weight = targs[2][0]
    if not all(isinstance(w, Tensor) and w.dtype == x.dtype for w in targs[2]):
        return None
    directions = 2 if targs[7] else 1
    batch = x.shape[0] if targs[8] else x.shape[1]
    fits = weight.dim() == 2 and weight.shape[1] == x.shape[2]
    if not fits or any(len(s) != 3 or s[:2] != (directions * targs[4], batch) for s in shapes):
        return None
    out = torch.empty((*x.shape[:2], directions * shapes[0][2]), dtype=x.dtype, device="meta")
    return (out, *(torch.empty(s, dtype=x.dtype, device="meta") for s in shapes))
