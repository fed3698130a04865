"""Positions: ``x[i]`` with a Python int ``i`` batches as one pick, as eager computes it.

An ``i`` that differs per instance (``log_probs[gold]``, ``states[i]``) becomes a per-instance
0-d int64 tensor and one pick (``x[arange(n), i]``, or a row of each node's packed rows); one
``i`` in ``x`` of any length (``states[-1]``) is one ragged step, inside cached module calls
too. Values, dtypes, gradients, ``requires_grad`` and errors equal the same code run one
instance at a time.
"""

from __future__ import annotations

import pytest
import torch

import batchfold as bf
from batchfold.errors import ShapeError, UnsupportedOpError
from batchfold.schedule import Scheduler
from reference import assert_matches_eager


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_a_per_instance_position_picks_in_one_step(scheduler: Scheduler) -> None:
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 7).double()

    def nll(item: tuple[torch.Tensor, int]) -> torch.Tensor:
        x, gold = item
        return -torch.log_softmax(lin(torch.as_tensor(x)), 0)[gold]

    golds = [3, 0, 6, -1, -7, 3, 2, 5, 1, 4, 6, 0]
    items = [(torch.randn(3, dtype=torch.float64), g) for g in golds]
    stats = assert_matches_eager(nll, items, lin, scheduler)
    assert stats.plan is not None
    picks = [s for s in stats.plan.steps if s.sig.name == "getitem"]
    assert sum(len(s.nodes) for s in picks) == len(golds) and len(picks) <= 2


@pytest.mark.parametrize("ragged", [True, False])
@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_positions_in_sequences_of_any_length_pick_in_one_step(
    scheduler: Scheduler, ragged: bool
) -> None:
    torch.manual_seed(1)
    w = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)

    def row(item: tuple[torch.Tensor, int]) -> torch.Tensor:
        x, i = item
        states = torch.tanh(torch.as_tensor(x) @ w)  # [T, 5], T differs per instance
        return states[i] * states[-1]  # states[-1]: the same position, other lengths

    lengths = [1, 3, 3, 5, 2, 5, 3, 1, 4]
    items = [
        (torch.randn(t, 4, dtype=torch.float64), (7 * k) % t - (k % 2) * t)
        for k, t in enumerate(lengths)
    ]
    got, stats = bf.batch_map(row, items, scheduler=scheduler, ragged=ragged, return_stats=True)
    want = [row(item) for item in items]
    for g, e in zip(got, want, strict=True):
        torch.testing.assert_close(g, e)
    (grad,) = torch.autograd.grad(torch.stack([g.sum() for g in got]).sum(), w)
    (expected,) = torch.autograd.grad(torch.stack([e.sum() for e in want]).sum(), w)
    torch.testing.assert_close(grad, expected)
    assert stats.plan is not None
    picks = [s for s in stats.plan.steps if s.sig.name == "getitem"]
    assert sum(len(s.nodes) for s in picks) == 2 * len(items)
    if ragged:  # the first call's own step, then one packed pick of all the others
        assert len(picks) == 2 and picks[1].lengths is not None


def test_a_write_into_a_picked_row_is_refused_as_for_any_view() -> None:
    # a picked row is a view of its matrix in eager; a write through it cannot be batched
    w = torch.randn(3, 4, dtype=torch.float64)

    def fn(item: tuple[torch.Tensor, int]) -> torch.Tensor:
        x, i = item
        h = torch.as_tensor(x) * w
        r = h[i]
        r.mul_(2.0)
        return h.sum() + r

    items = [(torch.randn(3, 4, dtype=torch.float64), i) for i in (0, 2, 1, 2, -3)]
    with pytest.raises(UnsupportedOpError, match="writes into a view"):
        bf.batch_map(fn, items)


def test_bool_and_out_of_range_positions_keep_eager_meaning() -> None:
    holder = torch.nn.Module()
    holder.w = torch.nn.Parameter(torch.randn(3, dtype=torch.float64))
    w = holder.w

    def fn(item: tuple[torch.Tensor, bool]) -> torch.Tensor:
        x, flag = item
        return (torch.as_tensor(x) * w)[flag]  # x[True] adds a dim, x[False] is empty

    items = [(torch.randn(3, dtype=torch.float64), flag) for flag in (True, False, True)]
    assert_matches_eager(fn, items, holder)

    def pick(item: tuple[torch.Tensor, int]) -> torch.Tensor:
        x, i = item
        return (torch.as_tensor(x) * w)[i]

    with pytest.raises(IndexError):
        pick((torch.randn(3, dtype=torch.float64), 3))
    with pytest.raises(ShapeError, match="index 3 is out of bounds for dimension 0 with size 3"):
        bf.batch_map(pick, [(torch.randn(3, dtype=torch.float64), i) for i in (0, 1, 3)])


@pytest.mark.parametrize("made", ["with grad", "without grad"])
def test_picks_outside_grad_mode_keep_eagers_requires_grad(made: str) -> None:
    # eager's x[i] is a view: taken under no_grad it keeps x's requires_grad; a pick is a copy,
    # so it is taken only of an x made outside grad mode too (which requires none)
    w = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)

    def fn(item: tuple[torch.Tensor, int]) -> torch.Tensor:
        x, i = item
        if made == "with grad":
            h = torch.as_tensor(x) @ w
            with torch.no_grad():
                return h[i]
        with torch.no_grad():
            return torch.log_softmax(torch.as_tensor(x) @ w, 0)[i]

    items = [(torch.randn(3, 3, dtype=torch.float64), i) for i in (0, 2, -1, 1, 2)]
    got, stats = bf.batch_map(fn, items, return_stats=True)
    want = [fn(item) for item in items]
    assert [g.requires_grad for g in got] == [e.requires_grad for e in want]
    for g, e in zip(got, want, strict=True):
        torch.testing.assert_close(g, e)
    assert stats.plan is not None
    picks = [s for s in stats.plan.steps if s.sig.name == "getitem"]
    assert len(picks) == (4 if made == "with grad" else 2)  # a step per position, or a pick


def test_a_users_index_tensor_out_of_range_fails_as_in_eager() -> None:
    def fn(item: tuple[torch.Tensor, int]) -> torch.Tensor:
        x, i = item
        return (torch.as_tensor(x) * 2)[torch.tensor(i)]

    items = [(torch.randn(3, 2), i) for i in (0, 5, 1)]
    with pytest.raises(IndexError, match="index 5 is out of bounds for dimension 0 with size 3"):
        fn(items[1])
    with pytest.raises(IndexError, match=r"getitem at .*test_positions.py.*index 5 is out"):
        bf.batch_map(fn, items)
    got = bf.batch_map(fn, [items[0], items[2]])
    for g, item in zip(got, [items[0], items[2]], strict=True):
        torch.testing.assert_close(g, fn(item))


class LastAndFirst(torch.nn.Module):
    """A module that reads fixed rows of a whole sequence: cached for every length."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.lin(x))
        return h[-1] * h[0] + h[1]


def test_fixed_rows_of_sequences_inside_a_module_are_one_cached_call() -> None:
    m = LastAndFirst().double()
    items = [torch.randn(t, 4, dtype=torch.float64) for t in [3, 5, 2, 3, 7, 2, 4, 4, 6]]
    params = list(m.parameters())
    stats = bf.Stats()
    for _ in range(2):  # the second batch_map reuses the confirmed call
        got, stats = bf.batch_map(lambda x: m(torch.as_tensor(x)), items, return_stats=True)
        want = [m(x) for x in items]
        for g, e in zip(got, want, strict=True):
            torch.testing.assert_close(g, e)
        grads = torch.autograd.grad(torch.stack(got).sum(), params)
        expected = torch.autograd.grad(torch.stack(want).sum(), params)
        for g, e in zip(grads, expected, strict=True):
            torch.testing.assert_close(g, e)
        assert not stats.module_misses
    assert stats.module_calls_cached == len(items) and stats.steps == 2  # the second run


def test_a_cached_call_on_a_sequence_without_the_row_fails_as_in_eager() -> None:
    m = LastAndFirst().double()
    items = [torch.randn(t, 4, dtype=torch.float64) for t in [3, 5, 2, 1, 4]]  # 1 row: no h[1]
    with pytest.raises(IndexError, match="index 1 is out of bounds"):
        m(items[3])
    with pytest.raises(
        IndexError, match=r"getitem at .*test_positions.py.*index 1 is out of range"
    ):
        bf.batch_map(lambda x: m(torch.as_tensor(x)), items)


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_the_same_row_of_sequences_of_any_length_is_one_step(scheduler: Scheduler) -> None:
    w = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)

    def fn(x: torch.Tensor) -> torch.Tensor:
        h = torch.as_tensor(x) @ w
        return h[-1] - h[0] * 2

    items = [torch.randn(t, 4, dtype=torch.float64) for t in [1, 3, 5, 2, 3, 7]]
    got, stats = bf.batch_map(fn, items, scheduler=scheduler, return_stats=True)
    for g, x in zip(got, items, strict=True):
        torch.testing.assert_close(g, fn(x))
    assert stats.plan is not None
    picks = [s for s in stats.plan.steps if s.sig.name == "getitem"]
    assert len(picks) == 2 and picks[-1].lengths is not None  # the first call, then a pick


def test_the_same_row_outside_grad_mode_keeps_eagers_requires_grad() -> None:
    w = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)

    def fn(x: torch.Tensor) -> torch.Tensor:
        h = torch.as_tensor(x) @ w
        with torch.no_grad():
            return h[-1]

    items = [torch.randn(t, 4, dtype=torch.float64) for t in [1, 3, 5, 2, 3]]
    got = bf.batch_map(fn, items)
    want = [fn(x) for x in items]
    assert [g.requires_grad for g in got] == [e.requires_grad for e in want]
    for g, e in zip(got, want, strict=True):
        torch.testing.assert_close(g, e)


def test_a_row_a_new_length_lacks_fails_at_its_line() -> None:
    w = torch.randn(4, 5, dtype=torch.float64)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return (torch.as_tensor(x) @ w)[2]

    items = [torch.randn(t, 4, dtype=torch.float64) for t in [3, 5, 4]]
    bf.batch_map(fn, items)  # the same row of three lengths: known
    with pytest.raises(
        ShapeError, match=r"getitem at .*test_positions.py.*index 2 is out of bounds"
    ):
        bf.batch_map(fn, [*items, torch.randn(1, 4, dtype=torch.float64)])
