"""One batched call of a step's op: its batching rule, the fallbacks when it has none, and
the checks of what it returned; a source step's payloads stacked.

The executor (:mod:`batchfold.execute`) gathers a step's inputs and calls these; cached
module traces (:mod:`batchfold.lazy.traces`) replay their ops through them too.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import torch

from .errors import BatchingRuleError, ShapeError, add_note
from .graph import Signature
from .opbase import rule_failure
from .ops import LOOP, VMAP
from .ragged import run_family

# PyTorch's own torch.tensor: the name in the torch namespace may be a function of the user's
# (a wrapper), which the instances' own calls have already gone through
_TENSOR = torch._C._VariableFunctions.tensor  # pyright: ignore[reportAttributeAccessIssue]

Tensor = torch.Tensor


class Fallbacks:
    """Nodes that ran without a batching rule of their own: counted per op and how.

    ``looped`` holds the signatures whose vmap failed: they run once per instance from then
    on, without trying vmap again.
    """

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.looped: set[Signature] = set()


def sources_batch(sig: Signature, payloads: list[Any], lengths: np.ndarray | None = None) -> Tensor:
    """Stack the payloads of a source step into one tensor (packed if ragged; a square
    family's ``[L, L, *rest]`` payloads as ``[sum L * L, *rest]``)."""
    meta = sig.out_metas[0]
    if lengths is not None:
        if sig.family is not None and sig.family.kind == "square":
            return torch.cat([p.reshape(p.shape[0] * p.shape[1], *p.shape[2:]) for p in payloads])
        return torch.cat(payloads)
    if sig.source == "scalar":
        try:
            return _TENSOR(payloads, dtype=meta.dtype, device=meta.device)
        except (RuntimeError, ValueError, OverflowError) as error:  # as eager's, with where
            bad = next((p for p in payloads if not _converts(p, meta.dtype)), None)
            add_note(error, f"raised by {sig.name} (recorded at {sig.site}) for {bad!r}")
            raise
    return torch.stack(payloads)  # "tensor" and "constant"


def _converts(number: Any, dtype: torch.dtype) -> bool:
    try:
        _TENSOR(number, dtype=dtype)
    except (RuntimeError, ValueError, OverflowError):
        return False
    return True


def run_op(
    sig: Signature, inputs: list[Tensor], n: int, fallbacks: Fallbacks
) -> tuple[Tensor, ...]:
    """One batched call of ``sig``'s op on ``inputs`` (each ``[n, ...]``): its outputs.

    The call runs under the grad mode its nodes were recorded in. An op whose vmap fails
    runs once per instance from then on; both are counted in ``fallbacks``. Outputs are
    checked against the recorded shapes and dtypes.
    """
    with sig.grad_mode():
        return _call_rule(sig, inputs, n, fallbacks)


def run_ragged(
    sig: Signature, inputs: list[Tensor], sizes: dict[int, np.ndarray], lengths: np.ndarray
) -> tuple[Tensor, ...]:
    """One packed call of a ragged step (see :mod:`batchfold.ragged`), its outputs checked."""
    try:
        with sig.grad_mode():
            outs = run_family(sig, inputs, lengths, sizes)
    except Exception as error:  # an index out of range in the rows, say: where, at least
        if "device-side assert" not in str(error):  # CUDA's: maybe an earlier op's
            add_note(error, f"raised by {sig.name} (recorded at {sig.site}) in a packed step")
        raise
    n, total = len(lengths), int(lengths.sum())
    for tensor, meta, ragged in zip(outs, sig.out_metas, sig.family.ragged_out, strict=True):
        expected = (total, *meta.shape[1:]) if ragged else (n, *meta.shape)
        if tuple(tensor.shape) != expected or tensor.dtype != meta.dtype:
            raise BatchingRuleError(
                f"the ragged {sig.family.kind} rule of {sig.name} (recorded at {sig.site}) "
                f"returned {tensor.dtype} {tuple(tensor.shape)}, expected {meta.dtype} "
                f"{expected}: a bug in batchfold's rule; please report it"
            )
    return outs


def _call_rule(
    sig: Signature, inputs: list[Tensor], n: int, fallbacks: Fallbacks
) -> tuple[Tensor, ...]:
    rule = LOOP if sig.rule.loops and sig in fallbacks.looped else sig.rule
    try:
        out = rule.batched(sig, inputs, n)
    except Exception as error:
        if isinstance(error, rule.user_errors):
            raise
        if not rule.loops:
            raise rule_failure(sig, rule, inputs, n, error) from error
        fallbacks.looped.add(sig)  # vmap cannot batch this op: once per instance from now on
        rule = LOOP
        try:
            out = LOOP.batched(sig, inputs, n)
        except Exception as looped:
            raise rule_failure(sig, LOOP, inputs, n, looped) from looped
    if rule is VMAP or rule is LOOP:
        fallbacks.counts[f"{sig.name} ({rule.name})"] += n
    outs = tuple(out) if sig.multi else (out,)
    for tensor, meta in zip(outs, sig.out_metas, strict=True):
        if tensor.shape != (n, *meta.shape) or tensor.dtype != meta.dtype:
            if getattr(sig.func, "batched", False):  # a user's bf.function(batched=True)
                raise ShapeError(
                    f"{sig.name} (a bf.function with batched=True, called at {sig.site}) "
                    f"returned {tensor.dtype} {tuple(tensor.shape)} for a batch of {n}; "
                    f"expected {meta.dtype} {(n, *meta.shape)}, one row per instance"
                )
            if rule.user:
                raise ShapeError(
                    f"{sig.name} (a Function block at {sig.site}) returned {tensor.dtype} "
                    f"{tuple(tensor.shape)} for a batch of {n}; expected {meta.dtype} "
                    f"{(n, *meta.shape)}, the output type it was declared (out_type) or first "
                    "found to have: a Function's output keeps one type for every batch"
                )
            raise BatchingRuleError(
                f"batching rule {rule.name} of {sig.name} (recorded at {sig.site}) "
                f"returned {tensor.dtype} {tuple(tensor.shape)}, expected {meta.dtype} "
                f"{(n, *meta.shape)}: a bug in batchfold's rule; please report it"
            )
    return outs
