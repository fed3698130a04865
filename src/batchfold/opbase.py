"""The batching-rule table's building blocks: :class:`OpRule`, ``RULES`` and the fallbacks.

``execute`` looks a rule up for each step and calls ``rule.batched(sig, inputs, n)``, where
``inputs`` are the step's per-instance inputs stacked along a new dimension 0. The rules
themselves live in :mod:`batchfold.ops` (elementwise, dims, indexing) and
:mod:`batchfold.ops_matrix` (matmul, layers, recurrent cells, losses); an op with no rule of
its own runs through ``torch.func.vmap`` (:data:`VMAP`) or once per instance (:data:`LOOP`).

A per-instance 0-d value has a batch dim once stacked, where eagerly it yields in type
promotion to tensors with dims of its own category (``float16[3] * float32[]`` is float16):
rules cast such an input to what eager promotion gives (:func:`zero_d_casts`), except where
eager kernels compute at its own precision (:func:`scalar_kept_wide`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .errors import BatchingRuleError, ShapeError, UnsupportedOpError, add_note
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
    # errors the rule raises about the instances' values (an index out of range), as eager
    # raises them: passed on to the user, where any other error is a bug in the rule
    user_errors: tuple[type[Exception], ...] = ()
    # a vmap of the op (which may fail on code vmap cannot run): then once per instance
    loops: bool = False
    # where ``applies`` says no: once per instance instead of vmap (whose rule for the op
    # skips eager's checks of the values)
    otherwise_loop: bool = False
    # ``batched`` is the user's own code (a blocks ``Function``): an output of the wrong type
    # is theirs to fix, not a bug in a rule
    user: bool = False


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


def register(funcs: Sequence[Any], rule: OpRule) -> None:
    for func in funcs:
        if func is not None:
            RULES[func] = rule


def named(*names: str) -> list[Any]:
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
    """Batch any op with ``torch.func.vmap`` over dimension 0 of every per-instance input.

    PyTorch's warning that vmap runs an op without a batching rule of its own (asking to
    file an issue with PyTorch) is switched off for the call (functorch's own switch, back
    on after it: a warnings filter per call would reset Python's record of warnings shown):
    the statistics count these steps (``Stats.fallbacks``)."""
    _FALLBACK_WARNING(False)
    try:
        return torch.func.vmap(lambda *xs: call_one(sig, xs), randomness="different")(*inputs)
    finally:
        _FALLBACK_WARNING(True)


_FALLBACK_WARNING = torch._C._functorch._set_vmap_fallback_warning_enabled  # pyright: ignore[reportAttributeAccessIssue]


def batched_loop(sig: Signature, inputs: list[Tensor], n: int) -> Any:
    """Run the op once per instance and stack the results (the last resort)."""
    results = [call_one(sig, [x[i] for x in inputs]) for i in range(n)]
    if sig.multi:
        return tuple(torch.stack(parts) for parts in zip(*results, strict=True))
    return torch.stack(results)


VMAP = OpRule("vmap", batched_vmap, loops=True)
LOOP = OpRule("loop", batched_loop)


def rule_failure(
    sig: Signature, rule: OpRule, inputs: list[Tensor], n: int, error: Exception
) -> Exception:
    """What to raise when a batched call of ``sig`` fails. Shapes were checked when the op was
    recorded, but some errors depend on values (an index out of range, a singular matrix):
    where one instance's row, run alone, raises the same kind of error, that error is the
    code's own, raised as eager execution raises it, with a note naming the op and its line.
    Otherwise the rule is at fault. A CUDA device-side assert (an index out of range on a
    GPU) is passed on as it is: the device is unusable after it, and it is reported
    asynchronously, maybe by a later op than the one at fault."""
    if "device-side assert" in str(error) or type(error).__name__ == "_StopRecomputationError":
        return error  # also a checkpoint's signal that it has recomputed enough, not a failure
    if isinstance(error, UnsupportedOpError):
        return error  # a refusal made while the step ran, which says what and why
    for row in range(n):
        try:
            call_one(sig, [x[row] for x in inputs])
        except Exception as own:
            if type(own) is type(error):
                add_note(
                    own,
                    f"raised by {sig.name} (recorded at {sig.site}) for row {row} of its "
                    f"batched step of {n}: run alone, as eager execution runs it, the op "
                    "raises the same",
                )
                return own
            break
    if rule.user or getattr(sig.func, "batched", False):  # the user's own batched code
        return ShapeError(
            f"{sig.name} (recorded at {sig.site}), code that takes a batch, raised over {n} "
            f"instances: {type(error).__name__}: {error}. It runs on each instance alone "
            "(a batch of 1), so it does not treat dim 0 as the batch everywhere: each input "
            "comes with a leading batch dim, a per-instance 0-d value as [n] (broadcast it over "
            "rows as s[:, None])."
        )
    return BatchingRuleError(
        f"batching rule {rule.name!r} of {sig.name} (recorded at {sig.site}) failed over {n} "
        f"instances: {type(error).__name__}: {error}. The op accepted these inputs' shapes "
        "when recorded and no instance alone raises it, so this is a bug in batchfold's rule; "
        "please report it with this message."
    )


def lift(x: Tensor, rank: int) -> Tensor:
    """View ``x`` [n, *shape] as [n, 1, ..., *shape] with ``rank`` dims after the batch dim."""
    missing = rank + 1 - x.dim()
    return x[(slice(None),) + (None,) * missing] if missing > 0 else x


# per-instance 0-d values in type promotion (see the module docstring) -------------------


_LOW = (torch.float16, torch.bfloat16)
_WIDE_SCALAR_SECOND = frozenset(
    [*named("mul", "multiply", "div", "divide", "true_divide", "floor_divide")]
    + [torch.Tensor.__mul__, torch.Tensor.__truediv__, torch.Tensor.__floordiv__]
)


def scalar_kept_wide(sig: Signature, casts: list[tuple[int, torch.dtype]]) -> bool:
    """Whether eager PyTorch (on the CPU) multiplies or divides half-precision values by a
    wider per-instance 0-d second operand at its own precision, rounding once: ``h * c``,
    ``h / c`` and ``h // c`` do (any rounding mode; ``c * h`` rounds ``c`` first), where
    casting ``c`` first would round twice."""
    if sig.func not in _WIDE_SCALAR_SECOND or sig.out_metas[0].dtype not in _LOW:
        return False
    args, _ = sig.template
    if len(args) < 2 or type(args[1]) is not Slot:
        return False
    second = args[1].index
    return any(i == second for i, _ in casts) and sig.in_metas[second].dtype.is_floating_point


def _category(dtype: torch.dtype) -> int:
    if dtype.is_complex:
        return 3
    if dtype.is_floating_point:
        return 2
    return 0 if dtype == torch.bool else 1


def zero_d_casts(sig: Signature) -> list[tuple[int, torch.dtype]]:
    """``(input, dtype)`` for each per-instance 0-d input that eager promotion casts
    (never ``where``'s condition, which takes no part in it)."""
    metas = sig.in_metas
    if all(m.shape for m in metas):
        return []
    skip = _where_condition(sig)
    inputs = [(i, m) for i, m in enumerate(metas) if i != skip]
    dims = [m.dtype for _, m in inputs if m.shape]
    dims += [t.dtype for t, _ in sig.shared if t.dim() > 0]
    zeros = [m.dtype for _, m in inputs if not m.shape]
    if not dims or not zeros:
        return []
    common = dims[0]
    for dtype in dims[1:]:
        common = torch.promote_types(common, dtype)
    zero = zeros[0]
    for dtype in zeros[1:]:
        zero = torch.promote_types(zero, dtype)
    if _category(zero) > _category(common):  # eager: the category of the 0-d, the precision
        common = _wider_category(common, zero)  # of the tensors with dims where it can
    return [(i, common) for i, m in inputs if not m.shape and m.dtype != common]


_WHERES = (torch.where, torch.Tensor.where)


def _where_condition(sig: Signature) -> int | None:
    """Which input is ``where``'s per-instance condition, if it has one."""
    if sig.func not in _WHERES or not isinstance(sig.template, tuple):
        return None
    args, kwargs = sig.template
    at = 1 if sig.func is torch.Tensor.where else 0  # x.where(condition, y)
    found = kwargs.get("condition", args[at] if len(args) > at else None)
    return found.index if type(found) is Slot else None


def _wider_category(dims: torch.dtype, zero: torch.dtype) -> torch.dtype:
    """The dtype eager promotion gives tensors with dims of ``dims`` and 0-d tensors of
    ``zero``, a wider category (PyTorch's ``combine_categories``)."""
    if zero.is_complex and dims in _COMPLEX_OF:
        return _COMPLEX_OF[dims]  # float32 + complex128: complex64
    return torch.promote_types(dims, zero)


_COMPLEX_OF = {
    torch.float16: torch.complex32,
    torch.bfloat16: torch.complex64,
    torch.float32: torch.complex64,
    torch.float64: torch.complex128,
}
