"""``torch.stack`` of many per-instance values runs with one gather (``batchfold.fused_stack``)
and gives eager's values, gradients and ``requires_grad``: values made at many depths and in
any order, any dim, under any grad mode, beside stacks that cannot be fused.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import batchfold as bf
from batchfold import execute, fused_stack
from batchfold.schedule import Scheduler
from reference import assert_matches_eager

pytestmark = pytest.mark.usefixtures("float64")


class _Chain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)


@settings(max_examples=25, deadline=None)
@given(
    counts=st.lists(st.integers(1, 7), min_size=1, max_size=5),
    dim=st.integers(-2, 1),
    reverse=st.booleans(),
    grad=st.booleans(),
    shared=st.booleans(),
    scheduler=st.sampled_from(["agenda", "depth"]),
)
def test_stacks_of_values_from_many_depths_match_eager(
    counts: list[int], dim: int, reverse: bool, grad: bool, shared: bool, scheduler: Scheduler
) -> None:
    torch.manual_seed(0)
    chain = _Chain()

    def fn(item: tuple[int, int]) -> Any:
        count, shift = item
        h = torch.full((3,), 0.1 * count)
        for _ in range(shift):  # instances of one count make their values at other depths
            h = torch.sin(h)
        values = []
        for _ in range(count):  # each value one step deeper than the last
            h = torch.tanh(chain.lin(h))
            values.append(h * 2 if shift != 2 else h + 1)  # from other steps: gathers permute
        if reverse:
            values.reverse()
        if shared:  # a tensor from outside in the list: not fused
            values.append(chain.lin.bias)
        with torch.set_grad_enabled(grad):
            stacked = torch.stack(values, dim=dim).sum(0), torch.stack(values[:1])
        return *stacked, h  # h keeps a gradient when the stacks have none

    # steps of several nodes, whose inputs come from several steps, interleaved
    items = [(count, shift) for count in counts for shift in (0, 2, 0, 1)]
    assert_matches_eager(fn, items, chain, scheduler)


def test_a_stack_of_many_inputs_is_fused_and_one_of_few_is_not() -> None:
    calls: list[int] = []
    original = fused_stack.fused_stack

    def counting(*args: Any) -> torch.Tensor:
        calls.append(len(args[1].gathers))
        return original(*args)

    def fn(count: int) -> Any:
        h = torch.ones(2) * count
        values = [h := torch.sin(h) for _ in range(count)]
        return torch.stack(values)

    execute.fused_stack = counting  # type: ignore[assignment]
    try:
        bf.batch_map(fn, [5, 5, 2, 2])
    finally:
        execute.fused_stack = original  # type: ignore[assignment]
    assert calls == [5], "the stack of 5 fused once; the stack of 2 gathers one by one"


def test_a_profiled_fused_stack_gives_the_same_values() -> None:
    def fn(count: int) -> Any:
        h = torch.ones(2) * count
        return torch.stack([h := torch.sin(h) for _ in range(count)]).sum(0)

    plain = bf.batch_map(fn, [4, 6, 4])
    profiled, stats = bf.batch_map(fn, [4, 6, 4], profile=True, return_stats=True)
    assert stats.profile is not None
    for a, b in zip(plain, profiled, strict=True):
        assert torch.equal(a, b)
