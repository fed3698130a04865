"""Property test: random block programs on sequences give the values and gradients of plain
per-instance PyTorch.

A program starts from a sequence of vectors of random length (0 included) and applies a
random chain of stages: maps, an RNN, folds, balanced reductions, sums, means, maxima,
n-grams, zips with a broadcast value, fan-outs and layers on vectors. Each stage has its block and a plain Python form on one instance's
tensors; the compiled program on a batch must equal the plain form run per instance, in
float64, with both schedulers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from blocks_oracle import per_instance
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from batchfold.blocks import (
    RNN,
    AllOf,
    Broadcast,
    Fold,
    Function,
    GetItem,
    Identity,
    Map,
    Max,
    Mean,
    NGrams,
    Reduce,
    Sum,
    TensorType,
    TupleType,
    Vector,
    Zeros,
    Zip,
    compile,
)
from reference import assert_grads_match, loss_of

DIM = 3
Seq = list[torch.Tensor]


class Weights(nn.Module):
    """The layers every stage shares."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(DIM, DIM)
        self.pair = nn.Linear(2 * DIM, DIM)

    def squash(self, x: torch.Tensor) -> torch.Tensor:
        """A layer on one vector or a batch of them."""
        return torch.tanh(self.lin(x))

    def combine(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """Two vectors (or batches of them) into one."""
        return torch.tanh(self.pair(torch.cat([a, b], -1)))

    def cell(self, x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """An RNN cell: ``(output, next state)``."""
        h = self.combine(x, h)
        return h * 0.5 + x, h


def _reduce(items: Seq, combine: Callable[[Any, Any], Any]) -> torch.Tensor:
    """Reduce's order: rounds combining items (0, 1), (2, 3), ...; an odd last one waits."""
    if not items:
        return torch.zeros(DIM)
    while len(items) > 1:
        paired = [combine(items[i], items[i + 1]) for i in range(0, len(items) - 1, 2)]
        items = paired + items[len(items) - len(items) % 2 :]
    return items[0]


def _rnn(w: Weights, items: Seq) -> Seq:
    h, ys = torch.zeros(DIM), []
    for x in items:
        y, h = w.cell(x, h)
        ys.append(y)
    return ys


def _fold(w: Weights, items: Seq) -> torch.Tensor:
    h = torch.zeros(DIM)
    for x in items:
        h = w.combine(h, x)
    return h


def stages(w: Weights) -> dict[str, tuple[str, str, Any, Callable[[Any], Any]]]:
    """name -> (input kind, output kind, block, the plain form on one instance)."""
    vec = TensorType((DIM,), torch.float64)
    cell = Function(w.cell, in_type=TupleType(vec, vec), name="cell")
    combine = Function(w.combine, name="combine")
    return {
        "map_layer": ("seq", "seq", Map(Function(w.squash)), lambda s: [w.squash(x) for x in s]),
        "map_gate": (
            "seq",
            "seq",
            Map(Function(lambda x: x * torch.sigmoid(x))),
            lambda s: [x * torch.sigmoid(x) for x in s],
        ),
        "rnn": ("seq", "seq", RNN(cell) >> GetItem(0), lambda s: _rnn(w, s)),
        "fold": ("seq", "vec", Fold(combine, Zeros(vec)), lambda s: _fold(w, s)),
        "reduce": ("seq", "vec", Reduce(combine), lambda s: _reduce(s, w.combine)),
        "sum": ("seq", "vec", Sum(), lambda s: _reduce(s, torch.add)),
        "max": ("seq", "vec", Max(), lambda s: _reduce(s, torch.maximum)),
        "mean": (
            "seq",
            "vec",
            Mean(),
            lambda s: _reduce(s, torch.add) / max(len(s), 1),
        ),
        "layer": ("vec", "vec", Function(w.squash), w.squash),
        "bigrams": (  # each pair of neighbours combined: one element fewer
            "seq",
            "seq",
            NGrams(2) >> Map(combine),
            lambda s: [w.combine(a, b) for a, b in zip(s, s[1:], strict=False)],
        ),
        "with_sum": (  # each element beside the sequence's sum, broadcast along it
            "seq",
            "seq",
            AllOf(Identity(), Sum() >> Broadcast()) >> Zip() >> Map(combine),
            lambda s: [w.combine(x, _reduce(s, torch.add)) for x in s],
        ),
        "fan_out": (  # one vector through two layers at once, then combined
            "vec",
            "vec",
            AllOf(Function(w.squash), Identity()) >> combine,
            lambda v: w.combine(w.squash(v), v),
        ),
    }


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
@settings(max_examples=25, deadline=None)
@given(
    choices=st.lists(st.integers(0, 99), min_size=1, max_size=5),
    lengths=st.lists(st.integers(0, 5), min_size=1, max_size=6),
    seed=st.integers(0, 2**16),
)
def test_random_block_programs_match_plain_pytorch(
    scheduler: str, choices: list[int], lengths: list[int], seed: int
) -> None:
    torch.manual_seed(seed)
    w = Weights()
    table = stages(w)
    kind, block, plain = "seq", Map(Vector(DIM, torch.float64)), [lambda s: s]
    for choice in choices:
        names = sorted(name for name, stage in table.items() if stage[0] == kind)
        _, kind, stage, form = table[names[choice % len(names)]]
        block, plain = block >> stage, [*plain, form]
    inputs = [torch.randn(n, DIM).tolist() for n in lengths]
    model = compile(block, scheduler=scheduler)  # type: ignore[arg-type]
    got = per_instance(model(inputs)[0], len(inputs))
    want = []
    for x in inputs:
        value: Any = [torch.tensor(v) for v in x]
        for form in plain:
            value = form(value)
        want.append(value)
    for g, v in zip(got, want, strict=True):
        g, v = (g, v) if isinstance(v, list) else ([g], [v])
        assert len(g) == len(v)
        for a, b in zip(g, v, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    if loss_of(want).requires_grad:  # not where every instance is empty or weightless
        assert_grads_match(got, want, list(w.parameters()), 1e-10)
