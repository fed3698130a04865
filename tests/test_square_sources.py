"""Per-instance ``[L, L, *rest]`` tensors (an adjacency, pair features) of every ``L`` are one
packed source step, and every kind of reader gets eager's values and gradients from it."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
import torch

import batchfold as bf
from batchfold.schedule import Scheduler
from reference import assert_matches_eager

DIM = 3
torch.manual_seed(0)
lin = torch.nn.Linear(2, DIM).double()
pair = torch.nn.Linear(3, 1).double()
MODULES = torch.nn.ModuleList([lin, pair])

Molecule = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # x [L, 2], A [L, L], P [L, L, 3]


def _parts(m: Molecule) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x, a, p = m
    return torch.as_tensor(x), torch.as_tensor(a), torch.as_tensor(p)


def _rounds(m: Molecule) -> torch.Tensor:
    x, a, _ = _parts(m)
    h = torch.tanh(lin(x))
    for _ in range(3):  # the adjacency read by three steps
        h = torch.tanh(a @ h + h)
    return h


def _rows(m: Molecule) -> Any:
    x, a, _ = _parts(m)
    n = len(a)
    index = torch.as_tensor([(3 * i + 1) % n for i in range(2 * n + 1)]) if n else None
    picked = a[index] if index is not None else a[:0]  # rows of another length
    return a.sum(1), torch.softmax(a, -1) @ lin(x), picked, torch.cat([a, a[:1]], 0), a[1:]


def _pairs(m: Molecule) -> Any:
    x, a, p = _parts(m)
    weights = pair(p).squeeze(-1)  # [L, L] from [L, L, 3]
    return weights @ lin(x) + a @ lin(x), p.sum(1), p.reshape(-1, 3).sum(0), p * 2


def _mixed(m: Molecule) -> torch.Tensor:
    x, a, _ = _parts(m)
    column = x[:, :1]
    b = a if len(a) % 2 else torch.sigmoid(column * column.t())  # a source or a computed one
    return b @ lin(x)


class Model(torch.nn.Module):
    """Message passing called as one module on ``(x, A)``."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = lin

    def forward(self, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.lin(x))
        return (a @ h + h).sum(0)


model = Model()
CASES: dict[str, Callable[[Molecule], Any]] = {
    "an adjacency read by three rounds": _rounds,
    "returned as it is, and exact-shape ops": lambda m: (
        _parts(m)[1],
        _parts(m)[1].sum() + (_parts(m)[1] * 2).abs().sum(),
        _parts(m)[1].t() @ _parts(m)[1],
        _parts(m)[2],
        lin(_parts(m)[0]),
    ),
    "its rows: reduced, indexed, concatenated, sliced": _rows,
    "pair features [L, L, 3]": _pairs,
    "beside a computed [L, L] in one reader": _mixed,
    "a module called on (x, A)": lambda m: model(*_parts(m)[:2]),
}


def _molecules(lengths: list[int], seed: int) -> list[Molecule]:
    gen = torch.Generator().manual_seed(seed)
    out = []
    for n in lengths:
        x = torch.randn(n, 2, dtype=torch.float64, generator=gen)
        a = (torch.rand(n, n, generator=gen) < 0.4).double() + torch.eye(n, dtype=torch.float64)
        out.append((x, a, torch.randn(n, n, 3, dtype=torch.float64, generator=gen)))
    return out


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_square_sources_of_every_length_equal_eager(case: str, scheduler: Scheduler) -> None:
    lengths = [0, 1, 1, 2, 3, 5, 4, 2, 6]
    random.Random(len(case)).shuffle(lengths)
    stats = assert_matches_eager(
        CASES[case], _molecules(lengths, len(case)), MODULES, scheduler=scheduler
    )
    assert stats.plan is not None
    squares = [s for s in stats.plan.steps if s.sig.family and s.sig.family.kind == "square"]
    # one packed step for each family (the two-column x of a 2-atom molecule is square too),
    # holding several lengths
    assert squares and len({id(s.sig.family) for s in squares}) == len(squares)
    assert all(s.lengths is not None and len(set(s.lengths.tolist())) > 1 for s in squares)


def test_square_sources_of_one_length_are_stacked() -> None:
    stats = assert_matches_eager(_rounds, _molecules([4] * 5, 0), MODULES)
    assert stats.plan is not None
    squares = [s for s in stats.plan.steps if s.sig.family and s.sig.family.kind == "square"]
    assert squares and all(s.lengths is None for s in squares)  # one shape: no packing


def test_gradients_reach_square_instance_tensors() -> None:
    def fn(m: Molecule) -> torch.Tensor:
        x, a, p = _parts(m)
        return (a @ lin(x)).sum() + (p * a.unsqueeze(-1)).sum(0)

    def inputs() -> list[Molecule]:
        return [
            tuple(t.clone().requires_grad_() for t in m)  # type: ignore[misc]
            for m in _molecules([3, 0, 1, 5, 2], 7)
        ]

    eager_in, batched_in = inputs(), inputs()
    eager = [fn(m) for m in eager_in]
    batched = bf.batch_map(fn, batched_in)
    for e, b in zip(eager, batched, strict=True):
        torch.testing.assert_close(b, e)
    flat = [t for m in eager_in for t in m]
    want = torch.autograd.grad(torch.stack([e.sum() for e in eager]).sum(), flat)
    total = torch.stack([b.sum() for b in batched]).sum()
    got = torch.autograd.grad(total, [t for m in batched_in for t in m])
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


def test_a_value_read_from_a_packed_square_source() -> None:
    def fn(m: Molecule) -> torch.Tensor:
        x, a, _ = _parts(m)
        if a.sum().item() > 2:  # a sync point on the square source
            return a @ lin(x)
        return lin(x) * 2

    assert_matches_eager(fn, _molecules([3, 1, 4, 2, 0, 5], 3), MODULES)


@pytest.mark.parametrize("first_square", [True, False])
def test_a_sequence_as_long_as_it_is_wide_is_read_as_rows(first_square: bool) -> None:
    # [2, 2] is square: it batches with the square sources, and ragged readers take its rows
    lengths = [2, 3, 0, 5, 2, 1] if first_square else [3, 2, 0, 5, 2, 1]

    def fn(m: Molecule) -> Any:
        x, a, _ = _parts(m)
        h = lin(torch.relu(x))
        return h.sum(0), x[1:], torch.cat([x, x[:1]]), a @ h

    assert_matches_eager(fn, _molecules(lengths, 5), MODULES)
