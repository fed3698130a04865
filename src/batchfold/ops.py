"""Batching rules: how one call over a batch computes what many per-instance calls would.

The table :data:`RULES` maps a PyTorch function (``torch.tanh``, ``F.linear``,
``torch.Tensor.__getitem__``, ...) to an :class:`OpRule`. ``execute`` looks the rule up for
each step and calls ``rule.batched(sig, inputs, n)``: ``inputs`` are the step's per-instance
inputs stacked along a new dimension 0. An op with no row runs through ``torch.func.vmap``
and, if vmap cannot batch it, once per instance; both are counted in the statistics.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .graph import Signature, Slot, TensorMeta

Tensor = torch.Tensor
Batched = Callable[[Signature, list[Tensor], int], Any]


@dataclass(frozen=True, slots=True)
class OpRule:
    """How to run one op over a batch; ``cheap`` ops (elementwise, views) win agenda ties."""

    name: str
    batched: Batched
    cheap: bool = False
    # whether the rule fits a call's template and per-instance input metas; else vmap
    applies: Callable[[tuple[Any, ...], dict[str, Any], tuple[TensorMeta, ...]], bool] | None = None


RULES: dict[Any, OpRule] = {}


def fill(template: Any, values: Sequence[Any]) -> Any:
    """Replace every :class:`Slot` in ``template`` (nested tuples, lists, dicts) by its value."""
    kind = type(template)
    if kind is Slot:
        return values[template.index]
    if kind is tuple or kind is list:
        return kind(fill(item, values) for item in template)
    if kind is dict:
        return {name: fill(item, values) for name, item in template.items()}
    return template


def call_one(sig: Signature, values: Sequence[Any]) -> Any:
    """Call the op of ``sig`` on one instance's inputs (the unbatched meaning)."""
    args, kwargs = sig.template
    return sig.func(*fill(args, values), **fill(kwargs, values))


def has_slot(template: Any) -> bool:
    """Whether a (nested) template holds a per-instance input."""
    kind = type(template)
    if kind is Slot:
        return True
    if kind is tuple or kind is list:
        return any(has_slot(item) for item in template)
    if kind is dict:
        return any(has_slot(item) for item in template.values())
    return False


def _register(funcs: Sequence[Any], rule: OpRule) -> None:
    for func in funcs:
        if func is not None:
            RULES[func] = rule


def _named(*names: str) -> list[Any]:
    """``torch.X``, ``torch.Tensor.X`` and ``F.X`` for each name, where they exist."""
    found = []
    for name in names:
        for space in (torch, torch.Tensor, F):
            func = getattr(space, name, None)
            if callable(func) and not isinstance(func, torch.dtype) and func not in found:
                found.append(func)
    return found


# vmap: the rule of every op without a row of its own -------------------------------------


def batched_vmap(sig: Signature, inputs: list[Tensor], n: int) -> Any:
    """Batch any op with ``torch.func.vmap`` over dimension 0 of every per-instance input."""
    return torch.func.vmap(lambda *xs: call_one(sig, xs), randomness="different")(*inputs)


def batched_loop(sig: Signature, inputs: list[Tensor], n: int) -> Any:
    """Run the op once per instance and stack the results (the last resort)."""
    results = [call_one(sig, [x[i] for x in inputs]) for i in range(n)]
    if sig.multi:
        return tuple(torch.stack(parts) for parts in zip(*results, strict=True))
    return torch.stack(results)


VMAP = OpRule("vmap", batched_vmap)
LOOP = OpRule("loop", batched_loop)


# elementwise ops: lift each input to the output's rank, then broadcasting does the rest ----


def _lift(x: Tensor, rank: int) -> Tensor:
    """View ``x`` [n, *shape] as [n, 1, ..., *shape] with ``rank`` dims after the batch dim."""
    missing = rank + 1 - x.dim()
    return x[(slice(None),) + (None,) * missing] if missing > 0 else x


def batched_rowwise(sig: Signature, inputs: list[Tensor], n: int) -> Any:
    """Elementwise op: per-instance dims line up behind the batch dim, shared tensors broadcast."""
    rank = len(sig.out_metas[0].shape)
    return call_one(sig, [_lift(x, rank) for x in inputs])


ROWWISE = OpRule("rowwise", batched_rowwise, cheap=True)
_register(
    _named(
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
        "masked_fill",
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
        "feature_alpha_dropout",
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


# layers whose weights are shared: the batch dim is one more leading dim -------------------


def batched_direct(sig: Signature, inputs: list[Tensor], n: int) -> Any:
    """The op already accepts any number of leading dims: call it on the batch as it is."""
    return call_one(sig, inputs)


def _only_first_slot(
    args: tuple[Any, ...], kwargs: dict[str, Any], metas: tuple[TensorMeta, ...]
) -> bool:
    return not has_slot(args[1:]) and not has_slot(kwargs)


_register(
    [F.linear, F.embedding, F.layer_norm, torch.layer_norm],
    OpRule("leading-dims", batched_direct, applies=_only_first_slot),
)


def batched_matmul(sig: Signature, inputs: list[Tensor], n: int) -> Any:
    """``x @ W`` with x per-instance and W shared, or ``W @ x`` with W a shared matrix."""
    args = sig.template[0]
    if type(args[0]) is Slot:
        return torch.matmul(inputs[0], args[1])
    weight, x = args[0], inputs[0]
    if len(sig.in_metas[0].shape) == 1:
        return torch.matmul(x, weight.transpose(-1, -2))
    return torch.matmul(weight, x)


def _one_side_matrix(
    args: tuple[Any, ...], kwargs: dict[str, Any], metas: tuple[TensorMeta, ...]
) -> bool:
    if kwargs or len(args) != 2:
        return False
    left, right = (type(a) is Slot for a in args)
    if left and not right:
        return True
    return right and not left and isinstance(args[0], Tensor) and args[0].dim() == 2


_register(
    _named("matmul", "mm", "mv") + [torch.Tensor.__matmul__],
    OpRule("matmul", batched_matmul, applies=_one_side_matrix),
)


def batched_rnn_cell(sig: Signature, inputs: list[Tensor], n: int) -> Any:
    """``lstm_cell``/``gru_cell``: fold the batch dim into the cell's own batch dim."""
    x = inputs[0]
    flat = [t.reshape(-1, t.shape[-1]) for t in inputs]
    out = call_one(sig, flat)
    if isinstance(out, tuple):
        return tuple(o.reshape(*x.shape[:-1], o.shape[-1]) for o in out)
    return out.reshape(*x.shape[:-1], out.shape[-1])


def _weights_shared(
    args: tuple[Any, ...], kwargs: dict[str, Any], metas: tuple[TensorMeta, ...]
) -> bool:
    return not has_slot(args[2:]) and not has_slot(kwargs)


_register(
    _named("lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell"),
    OpRule("rnn-cell", batched_rnn_cell, applies=_weights_shared),
)


# ops with a dimension argument: per-instance dim d is batched dim d + 1 --------------------


def _dim_arg(args: tuple[Any, ...], kwargs: dict[str, Any], pos: int, default: Any) -> Any:
    if "dim" in kwargs:
        return kwargs["dim"]
    return args[pos] if len(args) > pos else default


def _with_dim(args: tuple[Any, ...], kwargs: dict[str, Any], pos: int, dim: Any):
    if "dim" in kwargs or len(args) <= pos:
        return args, {**kwargs, "dim": dim}
    return args[:pos] + (dim,) + args[pos + 1 :], kwargs


def _shift(dim: Any, rank: int) -> Any:
    if isinstance(dim, (tuple, list)):
        return tuple(d % rank + 1 for d in dim)
    return dim % rank + 1


def dimwise(pos: int, default: Any = 0, extra_rank: int = 0, cheap: bool = False) -> OpRule:
    """A rule for ops whose ``dim`` argument sits at position ``pos`` (or is a keyword).

    ``extra_rank`` is 1 for ops such as ``stack`` whose dim indexes the output's rank.
    """

    def batched(sig: Signature, inputs: list[Tensor], n: int) -> Any:
        args, kwargs = sig.template
        rank = len(sig.in_metas[0].shape) + extra_rank
        dim = _dim_arg(args, kwargs, pos, default)
        args, kwargs = _with_dim(fill(args, inputs), fill(kwargs, inputs), pos, _shift(dim, rank))
        return sig.func(*args, **kwargs)

    def applies(
        args: tuple[Any, ...], kwargs: dict[str, Any], metas: tuple[TensorMeta, ...]
    ) -> bool:
        dim = _dim_arg(args, kwargs, pos, default)
        return dim is not None and type(args[0]) is Slot

    return OpRule("dim+1", batched, cheap=cheap, applies=applies)


_register(_named("chunk", "split", "split_with_sizes", "tensor_split"), dimwise(2, cheap=True))
_register(_named("unbind"), dimwise(1, cheap=True))
_register(_named("softmax", "log_softmax"), dimwise(1, default=None))
_register(_named("cumsum", "cumprod", "logsumexp"), dimwise(1, default=None))


def reduction() -> OpRule:
    """``sum``, ``max``, ``argmax``...: over given dims (dim+1), or over all of one instance."""
    by_dim = dimwise(1, default=None)

    def batched(sig: Signature, inputs: list[Tensor], n: int) -> Any:
        args, kwargs = sig.template
        if _dim_arg(args, kwargs, 1, None) is not None:
            return by_dim.batched(sig, inputs, n)
        out = sig.func(inputs[0].reshape(n, -1), 1, **kwargs)
        return out[0] if sig.multi is None and isinstance(out, tuple) else out  # max() -> values

    def applies(
        args: tuple[Any, ...], kwargs: dict[str, Any], metas: tuple[TensorMeta, ...]
    ) -> bool:
        if type(args[0]) is not Slot:
            return False
        dim = _dim_arg(args, kwargs, 1, None)
        if dim is None:
            return len(args) == 1 and kwargs.keys() <= {"dtype"}
        return type(dim) is int or (type(dim) in (tuple, list) and not has_slot(dim))

    return OpRule("reduce", batched, applies=applies)


_register(
    _named("sum", "mean", "prod", "amax", "amin", "max", "min", "argmax", "argmin", "all", "any"),
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
        first = next(a for a in args[0] if type(a) is Slot)
        rank = len(sig.in_metas[first.index].shape) + extra_rank
        dim = _shift(_dim_arg(args, kwargs, 1, 0), rank)
        parts = [inputs[a.index] if type(a) is Slot else a.expand(n, *a.shape) for a in args[0]]
        return sig.func(parts, dim)

    return OpRule("list dim+1", batched, cheap=True, applies=_tensors_in_list)


_register(_named("cat", "concat", "concatenate"), listwise(0))
_register(_named("stack"), listwise(1))


# indexing and views ----------------------------------------------------------------------


def _plain_index(
    args: tuple[Any, ...], kwargs: dict[str, Any], metas: tuple[TensorMeta, ...]
) -> bool:
    index = args[1] if isinstance(args[1], tuple) else (args[1],)
    return type(args[0]) is Slot and all(
        i is None or i is Ellipsis or type(i) in (int, slice) for i in index
    )


def batched_getitem(sig: Signature, inputs: list[Tensor], n: int) -> Any:
    """``x[i, 1:3, None]`` per instance is ``x[:, i, 1:3, None]`` over the batch."""
    index = sig.template[0][1]
    return inputs[0][(slice(None),) + (index if isinstance(index, tuple) else (index,))]


RULES[torch.Tensor.__getitem__] = OpRule("getitem", batched_getitem, True, _plain_index)


def batched_reshape(sig: Signature, inputs: list[Tensor], n: int) -> Any:
    """Ops that only regroup elements: reshape the batch to the known output shape."""
    return inputs[0].reshape(n, *sig.out_metas[0].shape)


_register(
    _named("reshape", "view", "flatten", "squeeze", "unsqueeze", "ravel", "view_as", "reshape_as"),
    OpRule("reshape", batched_reshape, cheap=True, applies=lambda a, k, m: type(a[0]) is Slot),
)


def batched_expand(sig: Signature, inputs: list[Tensor], n: int) -> Any:
    """``expand``/``broadcast_to``: lift to the output rank, then expand behind the batch dim."""
    shape = sig.out_metas[0].shape
    return _lift(inputs[0], len(shape)).expand(n, *shape)


_register(
    _named("expand", "expand_as", "broadcast_to"),
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
        return x.permute(0, *_shift(tuple(dims), rank))
    return x.transpose(_shift(args[1], rank), _shift(args[2], rank))


_register(
    _named("t", "transpose", "swapaxes", "permute"),
    OpRule("transpose", batched_transpose, True, lambda a, k, m: type(a[0]) is Slot and not k),
)


def batched_cross_entropy(sig: Signature, inputs: list[Tensor], n: int) -> Any:
    """One sample per instance: ``reduction="none"`` over the batch gives each instance's loss.

    An ignored target gives 0 under ``"sum"`` and 0/0 = nan under ``"mean"``, as eagerly.
    """
    args, kwargs = sig.template
    full = dict(
        zip(
            (
                "input",
                "target",
                "weight",
                "size_average",
                "ignore_index",
                "reduce",
                "reduction",
                "label_smoothing",
            ),
            fill(args, inputs),
            strict=False,
        )
    )
    full.update(fill(kwargs, inputs))
    logits, target = full["input"], full["target"]
    ignore = full.get("ignore_index", -100)
    smoothing = full.get("label_smoothing", 0.0)
    loss = F.cross_entropy(
        logits, target, reduction="none", ignore_index=ignore, label_smoothing=smoothing
    )
    if full.get("reduction", "mean") == "mean":
        loss = torch.where(target == ignore, torch.nan, loss)
    return loss


def _one_sample(
    args: tuple[Any, ...], kwargs: dict[str, Any], metas: tuple[TensorMeta, ...]
) -> bool:
    named = (
        dict(
            zip(
                (
                    "input",
                    "target",
                    "weight",
                    "size_average",
                    "ignore_index",
                    "reduce",
                    "reduction",
                ),
                args,
                strict=False,
            )
        )
        | kwargs
    )
    return (
        type(named.get("input")) is Slot
        and len(metas[0].shape) == 1
        and named.get("weight") is None
        and named.get("size_average") is None
        and named.get("reduce") is None
        and named.get("reduction", "mean") in ("mean", "sum")
    )


RULES[F.cross_entropy] = OpRule("cross-entropy", batched_cross_entropy, applies=_one_sample)


def rule_for(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], metas: tuple[TensorMeta, ...]
) -> OpRule:
    """The rule that batches ``func`` called with this template, or :data:`VMAP`."""
    rule = RULES.get(func)
    if rule is None or (rule.applies is not None and not rule.applies(args, kwargs, metas)):
        return VMAP
    return rule
