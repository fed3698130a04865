"""A Python number that differs per instance (``prediction - target``) batches, as eager computes.

Values, dtypes and gradients equal the same code run one instance at a time.
"""

from __future__ import annotations

import pytest
import torch

import batchfold as bf
from batchfold.errors import ShapeError, UnsupportedOpError
from batchfold.schedule import Scheduler

TARGETS = [0.37, -1.5, 2.0, 0.37, 1e-8, 3, -7, 0.1]


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_per_instance_number_is_batched_with_eagers_values(
    dtype: torch.dtype, scheduler: Scheduler
) -> None:
    w = torch.linspace(-1, 1, 4, dtype=dtype, requires_grad=True)

    def loss(item: tuple[torch.Tensor, float]) -> torch.Tensor:
        x, target = item
        prediction = (w * torch.as_tensor(x)).sum()  # 0-d
        return (prediction - target) ** 2 + (target * prediction) / 3 + (1 - prediction / target)

    items = [(torch.randn(4, dtype=dtype), t) for t in TARGETS]
    got, stats = bf.batch_map(loss, items, scheduler=scheduler, return_stats=True)
    want = [loss(item) for item in items]
    for g, e in zip(got, want, strict=True):
        assert g.dtype == e.dtype == dtype
        torch.testing.assert_close(g, e)
    (grad,) = torch.autograd.grad(torch.stack(got).sum(), w)
    (expected,) = torch.autograd.grad(torch.stack(want).sum(), w)
    torch.testing.assert_close(grad, expected)
    assert stats.plan is not None
    subs = [s for s in stats.plan.steps if s.sig.name == "sub"]
    assert sum(len(s.nodes) for s in subs) == len(TARGETS) and len(subs) <= 3


@pytest.mark.parametrize("dtype", [torch.float16, torch.int64, torch.int32])
def test_numbers_with_other_dtypes_stay_constants_of_their_op(dtype: torch.dtype) -> None:
    # eager computes float16 with the number in float32, and int tensors take a float number
    # to the default dtype: a 0-d tensor of either dtype would differ, so nothing changes
    def fn(item: tuple[torch.Tensor, float]) -> torch.Tensor:
        return torch.as_tensor(item[0]) * item[1] - item[1]

    items = [(torch.arange(1, 200).to(dtype), t) for t in TARGETS]
    got = bf.batch_map(fn, items)
    for g, item in zip(got, items, strict=True):
        e = fn(item)
        assert g.dtype == e.dtype
        assert torch.equal(g, e)  # float16 with the number rounded to float16 differs here


# x[i] with a Python int i that differs per instance ------------------------------------------


def _check(fn, items, params, scheduler: Scheduler = "agenda"):  # noqa: ANN001, ANN202
    got, stats = bf.batch_map(fn, items, scheduler=scheduler, return_stats=True)
    want = [fn(item) for item in items]
    for g, e in zip(got, want, strict=True):
        assert g.dtype == e.dtype and g.shape == e.shape
        torch.testing.assert_close(g, e)
    grads = torch.autograd.grad(torch.stack([g.sum() for g in got]).sum(), params)
    expected = torch.autograd.grad(torch.stack([e.sum() for e in want]).sum(), params)
    for g, e in zip(grads, expected, strict=True):
        torch.testing.assert_close(g, e)
    assert stats.plan is not None
    return stats


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_a_per_instance_position_picks_in_one_step(scheduler: Scheduler) -> None:
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 7).double()

    def nll(item: tuple[torch.Tensor, int]) -> torch.Tensor:
        x, gold = item
        return -torch.log_softmax(lin(torch.as_tensor(x)), 0)[gold]

    golds = [3, 0, 6, -1, -7, 3, 2, 5, 1, 4, 6, 0]
    items = [(torch.randn(3, dtype=torch.float64), g) for g in golds]
    stats = _check(nll, items, list(lin.parameters()), scheduler)
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
    w = torch.randn(3, dtype=torch.float64, requires_grad=True)

    def fn(item: tuple[torch.Tensor, bool]) -> torch.Tensor:
        x, flag = item
        return (torch.as_tensor(x) * w)[flag]  # x[True] adds a dim, x[False] is empty

    items = [(torch.randn(3, dtype=torch.float64), flag) for flag in (True, False, True)]
    _check(fn, items, [w])

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
    with pytest.raises(IndexError, match=r"getitem at .*test_number_operands.py.*index 5 is out"):
        bf.batch_map(fn, items)
    got = bf.batch_map(fn, [items[0], items[2]])
    for g, item in zip(got, [items[0], items[2]], strict=True):
        torch.testing.assert_close(g, fn(item))
