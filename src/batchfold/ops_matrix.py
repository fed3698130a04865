"""Batching rules for layers and matrix products: linear, embedding and layer norm, batch and
instance normalisation on their inputs' statistics, matmul in every per-instance/shared
combination, recurrent cells, and cross-entropy over one sample.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F

from .graph import Signature, Slot, TensorMeta
from .opbase import RULES, OpRule, call_one, fill, has_slot, lift, named, register

Tensor = torch.Tensor


# layers whose weights are shared: the batch dim is one more leading dim -------------------


def batched_direct(sig: Signature, inputs: list[Tensor], n: int) -> Any:
    """The op already accepts any number of leading dims: call it on the batch as it is."""
    return call_one(sig, inputs)


def _only_first_slot(
    args: tuple[Any, ...], kwargs: dict[str, Any], metas: tuple[TensorMeta, ...]
) -> bool:
    return not has_slot(args[1:]) and not has_slot(kwargs)


register(
    [F.linear, F.layer_norm, torch.layer_norm],
    OpRule("leading-dims", batched_direct, applies=_only_first_slot),
)
# A per-instance table: one lookup each, as vmap's rule reads a neighbour's row for an index
# out of range (eager raises) and gives the padding row a gradient in all but one instance.
register(
    [F.embedding],
    OpRule("lookup", batched_direct, applies=_only_first_slot, otherwise_loop=True),
)


# normalisation on the input's own statistics, as batch_map records it in training mode
# (lazy/running_stats.py): F.batch_norm(x, None, None, weight, bias, training=True) and the
# same for F.instance_norm. vmap's batched form rounds its backward pass otherwise than
# the kernel does for one instance (a weight's gradient 30% off in float32 for inputs far from
# 0), so the instances become more channels (batch norm) or more samples (instance norm) of
# one call of the kernel itself.


_NORMALISATIONS = {f: inspect.signature(f) for f in (F.batch_norm, F.instance_norm)}


def normalisation_arguments(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``F.batch_norm``'s or ``F.instance_norm``'s arguments by name, defaults filled in (a
    ``TypeError`` for arguments that do not bind)."""
    bound = _NORMALISATIONS[func].bind(*args, **kwargs)
    bound.apply_defaults()
    return bound.arguments


def batched_batch_norm(sig: Signature, inputs: list[Tensor], n: int) -> Any:
    """``[n, N, C, *rest]``: the instances' channels side by side, ``[N, n * C, *rest]``."""
    named = normalisation_arguments(F.batch_norm, *sig.template)
    x, weight, bias = inputs[0], named["weight"], named["bias"]
    channels = x.shape[2]
    wide = x.transpose(0, 1).reshape(x.shape[1], n * channels, *x.shape[3:])
    weight = None if weight is None else weight.repeat(n)
    bias = None if bias is None else bias.repeat(n)
    out = F.batch_norm(wide, None, None, weight, bias, True, 0.0, named["eps"])
    return out.reshape(x.shape[1], n, *x.shape[2:]).transpose(0, 1)


def batched_instance_norm(sig: Signature, inputs: list[Tensor], n: int) -> Any:
    """``[n, N, C, *rest]``: the instances' samples one after the other, ``[n * N, C, *rest]``."""
    named = normalisation_arguments(F.instance_norm, *sig.template)
    x, weight, bias, eps = inputs[0], named["weight"], named["bias"], named["eps"]
    out = F.instance_norm(x.reshape(-1, *x.shape[2:]), None, None, weight, bias, True, 0.0, eps)
    return out.reshape(x.shape)


def _own_statistics(func: Any, training: str) -> Any:
    def applies(args: tuple[Any, ...], kwargs: dict[str, Any], metas: Any) -> bool:
        """The input per instance, of 2 or more dims; no running statistics; training; a
        shared weight and bias (or none)."""
        try:
            named = normalisation_arguments(func, args, kwargs)
        except TypeError:
            return False
        return (
            type(named["input"]) is Slot
            and named["running_mean"] is None
            and named["running_var"] is None
            and named[training] is True
            and not has_slot((named["weight"], named["bias"], named["eps"]))
            and len(metas[0].shape) >= 2
        )

    return applies


RULES[F.batch_norm] = OpRule(
    "batch-norm", batched_batch_norm, applies=_own_statistics(F.batch_norm, "training")
)
RULES[F.instance_norm] = OpRule(
    "instance-norm",
    batched_instance_norm,
    applies=_own_statistics(F.instance_norm, "use_input_stats"),
)


def batched_matmul(sig: Signature, inputs: list[Tensor], n: int) -> Any:
    """``a @ b`` with either or both operands per-instance (see the two cases below)."""
    args = sig.template[0]
    if type(args[0]) is Slot and type(args[1]) is Slot:
        return _both_per_instance(inputs[args[0].index], inputs[args[1].index], sig)
    return _one_shared(sig, inputs)


def _both_per_instance(a: Tensor, b: Tensor, sig: Signature) -> Tensor:
    """``a_i @ b_i`` for every instance: vectors become one-row or one-column matrices, and
    the lower-rank operand is lifted so the batch dims line up."""
    ra, rb = (
        len(sig.in_metas[i].shape) for i in (sig.template[0][0].index, sig.template[0][1].index)
    )
    a = a.unsqueeze(-2) if ra == 1 else a
    b = b.unsqueeze(-1) if rb == 1 else b
    rank = max(a.dim(), b.dim()) - 1
    out = torch.matmul(lift(a, rank), lift(b, rank))
    if rb == 1:
        out = out.squeeze(-1)
    if ra == 1:
        out = out.squeeze(-1 if rb == 1 else -2)
    return out


def _one_shared(sig: Signature, inputs: list[Tensor]) -> Any:
    """``x @ W`` or ``W @ x`` with x per-instance and W shared, W of any rank.

    A per-instance vector becomes a one-row (or one-column) matrix, as matmul treats it, and
    x is lifted so that the batch dim sits in front of every dim W broadcasts over.
    """
    args = sig.template[0]
    x = inputs[0]
    vector = len(sig.in_metas[0].shape) == 1
    if type(args[0]) is Slot:
        weight = args[1]
        if weight.dim() <= 2:  # the common case: the batch dim is just one more leading dim
            return torch.matmul(x, weight)
        x = x.unsqueeze(-2) if vector else x
        out = torch.matmul(lift(x, max(x.dim() - 1, weight.dim())), weight)
        return out.squeeze(-2) if vector else out
    weight = args[0]
    x = x.unsqueeze(-1) if vector else x
    out = torch.matmul(weight, lift(x, max(x.dim() - 1, weight.dim())))
    return out.squeeze(-1) if vector else out


def _one_side_matrix(
    args: tuple[Any, ...], kwargs: dict[str, Any], metas: tuple[TensorMeta, ...]
) -> bool:
    if kwargs or len(args) != 2:
        return False
    left, right = (type(a) is Slot for a in args)
    if left and right:
        return True
    shared = args[1] if left else args[0]
    return left != right and isinstance(shared, Tensor) and shared.dim() >= 1


register(
    named("matmul", "mm", "mv", "bmm") + [torch.Tensor.__matmul__],
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
    """Per-instance input and state (a state from outside the function: vmap), shared weights."""
    state = args[1] if type(args[1]) in (tuple, list) else (args[1],)
    per_instance = type(args[0]) is Slot and all(type(h) is Slot for h in state)
    return per_instance and not has_slot(args[2:]) and not has_slot(kwargs)


register(
    named("lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell"),
    OpRule("rnn-cell", batched_rnn_cell, applies=_weights_shared),
)


# F.cross_entropy's parameters, in order
_CROSS_ENTROPY_PARAMS = (
    "input",
    "target",
    "weight",
    "size_average",
    "ignore_index",
    "reduce",
    "reduction",
    "label_smoothing",
)


def batched_cross_entropy(sig: Signature, inputs: list[Tensor], n: int) -> Any:
    """One sample per instance: ``reduction="none"`` over the batch gives each instance's loss.

    An ignored target gives 0 under ``"sum"`` and 0/0 = nan under ``"mean"``, as eagerly.
    Rows per instance (logits ``[N, C]``, classes ``[N]``): each row's loss, then their sum
    (or their mean over the rows not ignored) per instance.
    """
    args, kwargs = sig.template
    full = dict(zip(_CROSS_ENTROPY_PARAMS, fill(args, inputs), strict=False))
    full.update(fill(kwargs, inputs))
    logits, target = full["input"], full["target"]
    ignore = full.get("ignore_index", -100)
    smoothing = full.get("label_smoothing", 0.0)
    if logits.dim() == 3 and logits.dtype in (torch.float16, torch.bfloat16):
        reduction = full.get("reduction", "mean")  # eager adds half-precision rows its own way
        return torch.stack(
            [
                F.cross_entropy(x, t, reduction=reduction, ignore_index=ignore)
                for x, t in zip(logits, target, strict=True)
            ]
        )
    if logits.dim() == 3:  # [n, N, C]: the class dim second, as cross_entropy wants it
        rows = F.cross_entropy(
            logits.transpose(1, 2), target, reduction="none", ignore_index=ignore
        )
        total = rows.sum(1)
        if full.get("reduction", "mean") == "mean":
            total = total / (target != ignore).sum(1)
        return total
    loss = F.cross_entropy(
        logits, target, reduction="none", ignore_index=ignore, label_smoothing=smoothing
    )
    if target.is_floating_point():  # class probabilities: nothing is ignored
        return loss
    if full.get("reduction", "mean") == "mean":
        loss = torch.where(target == ignore, torch.nan, loss)
    return loss


def _one_sample(
    args: tuple[Any, ...], kwargs: dict[str, Any], metas: tuple[TensorMeta, ...]
) -> bool:
    named = dict(zip(_CROSS_ENTROPY_PARAMS, args, strict=False)) | kwargs
    return (
        type(named.get("input")) is Slot
        and type(named.get("target")) is Slot  # a shared target: the fallback
        and (len(metas[0].shape) == 1 or _rows_of_classes(named, metas))
        and named.get("weight") is None
        and named.get("size_average") is None
        and named.get("reduce") is None
        and named.get("reduction", "mean") in ("mean", "sum")
    )


def _rows_of_classes(named: dict[str, Any], metas: tuple[TensorMeta, ...]) -> bool:
    """Logits ``[N, C]`` with ``[N]`` class indices, without label smoothing."""
    if len(metas) != 2 or len(metas[0].shape) != 2 or named.get("label_smoothing", 0.0) != 0.0:
        return False
    logits, target = metas  # the slots in argument order: input, then target
    return target.dtype == torch.int64 and target.shape == logits.shape[:1]


RULES[F.cross_entropy] = OpRule("cross-entropy", batched_cross_entropy, applies=_one_sample)
