"""The blocks oracle: a compiled block on a batch equals a plain Python reference per input."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from batchfold.blocks import Block, SequenceBatch, compile
from batchfold.schedule import Scheduler
from reference import assert_grads_match


def per_instance(batched: Any, count: int) -> list[Any]:
    """Split batched outputs (tensors, tuples, sequence batches) into one structure per input."""
    if batched is None:
        return [None] * count
    if isinstance(batched, SequenceBatch):
        lengths = batched.lengths.tolist()
        return [list(batched.values[i, :n].unbind(0)) for i, n in enumerate(lengths)]
    if isinstance(batched, tuple):
        parts = [per_instance(item, count) for item in batched]
        return [tuple(part[i] for part in parts) for i in range(count)]
    return list(batched.unbind(0))


def assert_close_structures(got: Any, want: Any, rtol: float) -> None:
    """Equal structure, and equal tensors (shape, dtype and values)."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"expected a tensor, got {got!r}"
        assert got.shape == want.shape and got.dtype == want.dtype, (got, want)
        torch.testing.assert_close(got, want, rtol=rtol, atol=rtol)
        return
    if isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want), (got, want)
        for g, w in zip(got, want, strict=True):
            assert_close_structures(g, w, rtol)
        return
    assert got == want, (got, want)


def assert_block_matches(
    block: Block,
    inputs: Sequence[Any],
    reference: Callable[[Any], Any],
    params: Sequence[torch.Tensor] = (),
    scheduler: Scheduler = "agenda",
    rtol: float = 1e-10,
    eval_too: bool = True,
) -> Any:
    """``compile(block)(inputs)`` equals ``[reference(x) for x in inputs]``, values and grads.

    With ``eval_too``, ``block.eval(x)`` is checked on the first inputs as well. Returns the
    compiled model's metrics.
    """
    model = compile(block, scheduler=scheduler)
    batched, metrics = model(inputs)
    got = per_instance(batched, len(inputs))
    want = [reference(x) for x in inputs]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert_close_structures(g, w, rtol)
    if params:
        assert_grads_match(got, want, list(params), rtol)
    if eval_too:
        for x in inputs[:2]:
            result = block.eval(x)
            if model._metric_types:
                result = result[0]
            assert_close_structures(result, reference(x), rtol)
    return metrics
