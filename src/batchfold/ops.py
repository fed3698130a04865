"""Batching rules: how one call over a batch computes what many per-instance calls would.

The table :data:`RULES` maps a PyTorch function (``torch.tanh``, ``F.linear``,
``torch.Tensor.__getitem__``, ...) to an :class:`OpRule`. ``execute`` looks the rule up for
each step and calls ``rule.batched(sig, inputs, n)``: ``inputs`` are the step's per-instance
inputs stacked along a new dimension 0. An op with no row runs through ``torch.func.vmap``
and, if vmap cannot batch it, once per instance; both are counted in the statistics.
"""

from __future__ import annotations

from typing import Any

import torch

from . import ops_matrix as ops_matrix  # registers the layer and matrix rules
from .graph import Signature, Slot, TensorMeta
from .opbase import (
    LOOP,
    RULES,
    VMAP,
    Batched,
    OpRule,
    batched_loop,
    batched_vmap,
    call_one,
    fill,
    has_slot,
    lift,
    named,
    register,
    scalar_kept_wide,
    zero_d_casts,
)
from .ops_views import shift_dim  # also registers indexing and view rules

Tensor = torch.Tensor
__all__ = [
    "LOOP",
    "RULES",
    "VMAP",
    "Batched",
    "OpRule",
    "batched_loop",
    "batched_vmap",
    "call_one",
    "fill",
    "has_slot",
    "lift",
    "rule_for",
]

# elementwise ops: lift each input to the output's rank, then broadcasting does the rest ----


def batched_rowwise(sig: Signature, inputs: list[Tensor], n: int) -> Any:
    """Elementwise op: per-instance dims line up behind the batch dim, shared tensors broadcast.

    A per-instance 0-d input has a batch dim here, so PyTorch would let its dtype take part
    in type promotion, where eagerly a 0-d tensor yields to tensors with dims of its own
    category: such an input is cast to what eager promotion gives.
    """
    rank = len(sig.out_metas[0].shape)
    lifted = [lift(x, rank) for x in inputs]
    casts = zero_d_casts(sig)
    if casts and scalar_kept_wide(sig, casts):
        return call_one(sig, [x.float() for x in lifted]).to(sig.out_metas[0].dtype)
    for i, dtype in casts:
        lifted[i] = lifted[i].to(dtype)
    return call_one(sig, lifted)


ROWWISE = OpRule("rowwise", batched_rowwise, cheap=True)
register(
    named(
        "abs",
        "neg",
        "exp",
        "expm1",
        "log",
        "log1p",
        "log2",
        "sqrt",
        "rsqrt",
        "sin",
        "cos",
        "tanh",
        "sigmoid",
        "relu",
        "relu6",
        "elu",
        "selu",
        "celu",
        "gelu",
        "silu",
        "mish",
        "leaky_relu",
        "hardtanh",
        "softplus",
        "softsign",
        "logsigmoid",
        "square",
        "reciprocal",
        "sign",
        "floor",
        "ceil",
        "round",
        "trunc",
        "clamp",
        "clip",
        "add",
        "sub",
        "mul",
        "div",
        "true_divide",
        "pow",
        "maximum",
        "minimum",
        "where",
        "lerp",
        "addcmul",
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
        "logical_and",
        "logical_or",
        "logical_not",
        "zeros_like",
        "ones_like",
        "full_like",
        "rand_like",
        "randn_like",
        "empty_like",
        "float",
        "double",
        "half",
        "long",
        "int",
        "bool",
        "to",
        "type_as",
        "contiguous",
        "clone",
        "detach",
        "dropout",
        "alpha_dropout",
        "nan_to_num",
        "hardsigmoid",
        "hardswish",
        "threshold",
        "atan",
        "tan",
        "asin",
        "acos",
        "sinh",
        "cosh",
        "erf",
        "fmod",
        "remainder",
        "floor_divide",
    )
    + [
        getattr(torch.Tensor, f"__{op}__")
        for op in (
            "add",
            "radd",
            "sub",
            "rsub",
            "mul",
            "rmul",
            "truediv",
            "rtruediv",
            "neg",
            "pow",
            "rpow",
            "abs",
            "eq",
            "ne",
            "lt",
            "le",
            "gt",
            "ge",
            "and",
            "or",
            "xor",
            "invert",
            "floordiv",
            "rfloordiv",
            "mod",
        )
    ],
    ROWWISE,
)


def batched_masked_fill(sig: Signature, inputs: list[Tensor], n: int) -> Any:
    """``masked_fill``, elementwise; a per-instance 0-d value, lifted to ``[n, 1...]``, which
    ``masked_fill`` refuses (it takes 0-d values only), as ``torch.where(mask, value, x)``:
    the same values, and the same gradients (the value's, summed over where the mask is set),
    with the value cast to ``x``'s dtype first as ``masked_fill`` casts it."""
    args, kwargs = sig.template
    value = args[2] if len(args) > 2 else kwargs.get("value")
    if type(value) is not Slot:
        return batched_rowwise(sig, inputs, n)
    rank, dtype = len(sig.out_metas[0].shape), sig.out_metas[0].dtype
    lifted = [lift(x, rank) for x in inputs]
    x, mask = fill(args[0], lifted), fill(args[1] if len(args) > 1 else kwargs["mask"], lifted)
    return torch.where(mask, lifted[value.index].to(dtype), x)


register(named("masked_fill"), OpRule("masked_fill", batched_masked_fill, True))


# ops with a dimension argument: per-instance dim d is batched dim d + 1 --------------------


def dim_arg(args: tuple[Any, ...], kwargs: dict[str, Any], pos: int, default: Any) -> Any:
    """An op's ``dim`` argument: by keyword (``dim``, or NumPy's ``axis``, which PyTorch
    takes too), else at position ``pos``, else ``default``."""
    for name in _DIM_NAMES:
        if name in kwargs:
            return kwargs[name]
    return args[pos] if len(args) > pos else default


_DIM_NAMES = ("dim", "axis")


def _with_dim(args: tuple[Any, ...], kwargs: dict[str, Any], pos: int, dim: Any):
    for name in _DIM_NAMES:
        if name in kwargs:
            return args, {**kwargs, name: dim}
    if len(args) <= pos:
        return args, {**kwargs, "dim": dim}
    return args[:pos] + (dim,) + args[pos + 1 :], kwargs


def dimwise(pos: int, default: Any = 0, extra_rank: int = 0, cheap: bool = False) -> OpRule:
    """A rule for ops whose ``dim`` argument sits at position ``pos`` (or is a keyword).

    ``extra_rank`` is 1 for ops such as ``stack`` whose dim indexes the output's rank.
    """

    def batched(sig: Signature, inputs: list[Tensor], n: int) -> Any:
        args, kwargs = sig.template
        rank = len(sig.in_metas[0].shape) + extra_rank
        dim = dim_arg(args, kwargs, pos, default)
        args, kwargs = _with_dim(
            fill(args, inputs), fill(kwargs, inputs), pos, shift_dim(dim, rank)
        )
        return sig.func(*args, **kwargs)

    def applies(
        args: tuple[Any, ...], kwargs: dict[str, Any], metas: tuple[TensorMeta, ...]
    ) -> bool:
        dim = dim_arg(args, kwargs, pos, default)
        return dim is not None and type(args[0]) is Slot

    return OpRule("dim+1", batched, cheap=cheap, applies=applies)


register(named("chunk", "split", "split_with_sizes", "tensor_split"), dimwise(2, cheap=True))
register(named("unbind"), dimwise(1, cheap=True))
register(named("softmax", "log_softmax"), dimwise(1, default=None))
register(named("cumsum", "cumprod", "logsumexp"), dimwise(1, default=None))


def reduction() -> OpRule:
    """``sum``, ``max``, ``argmax``...: over given dims (dim+1), or over all of one instance."""
    by_dim = dimwise(1, default=None)

    def batched(sig: Signature, inputs: list[Tensor], n: int) -> Any:
        args, kwargs = sig.template
        if dim_arg(args, kwargs, 1, None) is not None:
            return by_dim.batched(sig, inputs, n)
        rest = {k: v for k, v in kwargs.items() if k not in ("dim", "keepdim")}
        out = sig.func(inputs[0].reshape(n, -1), 1, **rest)
        out = out[0] if sig.multi is None and isinstance(out, tuple) else out  # max() -> values
        if kwargs.get("keepdim"):  # x.argmax(keepdim=True): every dim kept, of size 1
            out = out.reshape(n, *(1,) * len(sig.in_metas[0].shape))
        return out

    def applies(
        args: tuple[Any, ...], kwargs: dict[str, Any], metas: tuple[TensorMeta, ...]
    ) -> bool:
        if type(args[0]) is not Slot:
            return False
        dim = dim_arg(args, kwargs, 1, None)
        if dim is None:
            return len(args) == 1 and kwargs.keys() <= {"dtype", "dim", "keepdim"}
        # an empty list of dims reduces every dim eagerly, the batch's too here: a fallback
        return type(dim) is int or (type(dim) in (tuple, list) and bool(dim) and not has_slot(dim))

    return OpRule("reduce", batched, applies=applies)


register(
    named("sum", "mean", "prod", "amax", "amin", "max", "min", "argmax", "argmin", "all", "any"),
    reduction(),
)


def _tensors_in_list(
    args: tuple[Any, ...], kwargs: dict[str, Any], metas: tuple[TensorMeta, ...]
) -> bool:
    return isinstance(args[0], (list, tuple)) and any(type(a) is Slot for a in args[0])


def listwise(extra_rank: int) -> OpRule:
    """``cat``/``stack``: shared tensors in the list are expanded along the batch dim."""

    def batched(sig: Signature, inputs: list[Tensor], n: int) -> Any:
        args, kwargs = sig.template
        items = args[0]
        if not extra_rank:  # eager cat skips 1-d empty tensors among others: so must the batch's
            shapes = [sig.in_metas[a.index].shape if type(a) is Slot else a.shape for a in items]
            kept = [a for a, shape in zip(items, shapes, strict=True) if shape != (0,)]
            items = kept if kept and any(type(a) is Slot for a in kept) else items
        first = next(a for a in items if type(a) is Slot)
        rank = len(sig.in_metas[first.index].shape) + extra_rank
        dim = shift_dim(dim_arg(args, kwargs, 1, 0), rank)
        parts = [inputs[a.index] if type(a) is Slot else a.expand(n, *a.shape) for a in items]
        return sig.func(parts, dim)

    return OpRule("list dim+1", batched, cheap=True, applies=_tensors_in_list)


register(named("cat", "concat", "concatenate"), listwise(0))
register(named("stack"), listwise(1))
# vmap's rules for these skip eager's check of the per-instance indices (one_hot leaves a row
# out of range all zeros; index_fill writes into another instance's row): one call each
register(named("one_hot", "index_fill"), LOOP)


def rule_for(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], metas: tuple[TensorMeta, ...]
) -> OpRule:
    """The rule that batches ``func`` called with this template, or :data:`VMAP`."""
    rule = RULES.get(func)
    if rule is None or rule.applies is None:
        return rule or VMAP
    try:
        fits = rule.applies(args, kwargs, metas)
    except (IndexError, KeyError, TypeError, AttributeError):  # a call form the rule never saw
        fits = False
    return rule if fits else LOOP if rule.otherwise_loop else VMAP
