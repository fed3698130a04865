"""``bf.function`` calls against eager PyTorch: which outputs require grad, named tuples, and
changes of what the function reaches (its module's attributes and weights) between calls."""

from __future__ import annotations

from collections import namedtuple
from typing import Any

import pytest
import torch
from torch import nn

import batchfold as bf
from reference import assert_matches_eager

pytestmark = pytest.mark.usefixtures("float64")

SCHEDULERS = ["agenda", "depth"]
_Pair = namedtuple("_Pair", "first second")


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.scale = 1.0

    def forward(self, h: Any) -> Any:
        return self.lin(h) * self.scale


def _xs() -> list[list[float]]:
    return [[1.0, 2.0, 3.0], [0.5, -1.0, 2.0], [3.0, 1.0, 0.0], [2.0, 2.0, -1.0]]


@pytest.mark.parametrize("scheduler", SCHEDULERS)
@pytest.mark.parametrize("batched", [False, True])
def test_outputs_require_grad_where_eagers_do(batched: bool, scheduler: str) -> None:
    """Every output claimed ``requires_grad=True``: read inside the function (a branch on it)
    and, batched in one step with rows that need grad, in the results too."""
    torch.manual_seed(0)
    lin = nn.Linear(3, 3)
    double = bf.function(lambda a: a * 2, batched=batched)
    pair = bf.function(lambda a, b: (a + 1, b * 3, lin(a)), batched=batched)

    def fn(x: list[float]) -> Any:
        t = torch.tensor(x)
        a = double(t)
        h = lin(t)
        first, second, third = pair(t, h)
        with torch.no_grad():
            quiet = double(h)
        return a * (10 if a.requires_grad else 1), double(h), first, second, third, quiet

    stats = assert_matches_eager(fn, _xs(), lin, scheduler=scheduler)  # type: ignore[arg-type]
    assert stats.nodes > 0


@pytest.mark.parametrize("batched", [False, True])
def test_a_named_tuple_comes_back_as_one(batched: bool) -> None:
    """``NT(a, b)`` was rebuilt as ``NT([a, b])``: a TypeError inside batch_map."""
    split = bf.function(lambda a: _Pair(a * 2, a + 1), batched=batched)

    def fn(x: list[float]) -> Any:
        out = split(torch.tensor(x))
        assert type(out) is _Pair
        return out.first - out.second

    assert_matches_eager(fn, _xs())


@pytest.mark.parametrize("batched", [False, True])
def test_a_change_of_what_the_function_reaches_between_calls_is_refused(batched: bool) -> None:
    """The batched call runs when the batch runs: a module attribute set or a weight changed
    in place between two calls gave the second call's value to both, without a word."""
    model = _Scaled()
    cell = bf.function(model, batched=batched)

    def rescaled(x: list[float]) -> Any:
        h = torch.tensor(x)
        first = cell(h)
        model.scale = 5.0
        second = cell(h)
        model.scale = 1.0
        return first, second

    with pytest.raises(
        bf.UnsupportedOpError, match=r"an attribute of _Scaled, which .*set between"
    ):
        bf.batch_map(rescaled, _xs())
    bias = model.lin.bias

    def shifted(x: list[float]) -> Any:
        h = torch.tensor(x)
        first = cell(h)
        with torch.no_grad():
            bias.add_(1.0)
        return first, cell(h)

    with pytest.raises(bf.UnsupportedOpError, match=r"changed in place"):
        bf.batch_map(shifted, _xs())
    with torch.no_grad():
        bias.sub_(1.0)
    closure = torch.ones(3)
    scaled = bf.function(lambda a: a * closure, batched=batched)

    def closed(x: list[float]) -> Any:
        h = torch.tensor(x)
        first = scaled(h)
        closure.mul_(2)
        return first, scaled(h)

    with pytest.raises(bf.UnsupportedOpError, match=r"changed in place"):
        bf.batch_map(closed, _xs())


def test_a_change_before_or_after_the_calls_is_fine() -> None:
    model = _Scaled()
    cell = bf.function(model)

    def fn(x: list[float]) -> Any:
        h = torch.tensor(x)
        out = cell(h)
        return out, float(out.detach().sum())  # a sync point: the calls ran

    for scale in (1.0, 3.0):
        model.scale = scale
        assert_matches_eager(fn, _xs(), model)


@pytest.mark.parametrize("instances", [2, 3])
def test_a_batched_function_that_is_not_row_by_row_is_the_users_error(instances: int) -> None:
    """A per-instance 0-d value arrives as [n]; ``a * s`` then failed over the batch (called
    a bug in batchfold's rule) or, with as many instances as a row is wide, broadcast along
    the rows without a word."""
    scale = bf.function(lambda a, s: a * s, batched=True)
    fn = lambda x: scale(torch.tensor(x), torch.tensor(x)[0])  # noqa: E731
    with pytest.raises(bf.ShapeError, match=r"takes a batch, but on 2 rows .*s\[:, None\]"):
        bf.batch_map(fn, _xs()[:instances])
    rowwise = bf.function(lambda a, s: a * s[:, None], batched=True)
    assert_matches_eager(lambda x: rowwise(torch.tensor(x), torch.tensor(x)[0]), _xs()[:3])


def test_setting_requires_grad_of_a_lazy_value_is_its_method() -> None:
    """``t.requires_grad = True`` met an AttributeError (a property without a setter)."""

    def made_leaf(x: list[float]) -> Any:
        t = torch.tensor(x)
        t.requires_grad = True
        return t

    with pytest.raises(
        bf.UnsupportedOpError, match=r"requires_grad_ of a lazy tensor at .*not a leaf"
    ):
        bf.batch_map(made_leaf, _xs())

    def unchanged(x: list[float]) -> Any:
        t = torch.tensor(x) * 2
        t.requires_grad = False  # what it is: nothing changes, as eagerly
        return t

    assert_matches_eager(unchanged, _xs())


@pytest.mark.parametrize("batched", [True, False])
def test_a_function_that_branches_on_zeros_keeps_its_outputs_gradient(batched: bool) -> None:
    # its outputs' requires_grad came from a call on zeros, which took the other branch: the
    # results needed no grad, and no gradient reached the weight
    weight = nn.Parameter(torch.randn(3, dtype=torch.float64))

    def skip_zeros(x: torch.Tensor) -> torch.Tensor:
        return x * weight if bool(x.abs().sum() > 0) else x.clone()

    batched_fn = bf.function(skip_zeros, batched=batched)
    items = [torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), torch.tensor([[1.0, -1.0, 2.0]])]
    items = [x.double() for x in items]
    got = bf.batch_map(lambda x: batched_fn(torch.as_tensor(x)).sum(0), items)
    want = [skip_zeros(x).sum(0) for x in items]
    assert [g.requires_grad for g in got] == [w.requires_grad for w in want] == [True, True]
    (grad,) = torch.autograd.grad(torch.stack(got).sum(), weight)
    (eager,) = torch.autograd.grad(torch.stack(want).sum(), weight)
    torch.testing.assert_close(grad, eager)


@pytest.mark.parametrize(
    ("body", "shape"),
    [
        (lambda a: torch.softmax(a, 0), (3,)),
        (lambda a: a - a.mean(0, keepdim=True), (3,)),
        (lambda a: a.cumsum(0), (3,)),
        (nn.BatchNorm1d(3).double(), (3, 4)),  # in training: statistics over batch and length
    ],
    ids=["softmax over the batch", "centred on the batch", "cumsum over the batch", "BatchNorm"],
)
def test_a_batched_function_whose_rows_depend_on_each_other_is_refused(
    body: Any, shape: tuple[int, ...]
) -> None:
    """Same shapes, so the shape check passed, and each instance saw the others' rows."""
    f = bf.function(body, batched=True)
    with pytest.raises(bf.ShapeError, match="depends on the other rows"):
        items = [torch.randn(*shape, dtype=torch.float64) for _ in range(4)]
        bf.batch_map(lambda x: f(torch.as_tensor(x)), items)


@pytest.mark.parametrize("batched", [False, True])
def test_the_probes_of_a_function_that_draws_leave_the_generator_as_eager_does(
    batched: bool,
) -> None:
    """Its calls on made-up values, to learn its outputs, drew from the generator: the masks
    and every later draw differed from eager's."""
    lin = nn.Linear(3, 3).double()
    f = bf.function(lambda a: nn.functional.dropout(lin(a), 0.5, training=True), batched=batched)
    items = [torch.randn(3, dtype=torch.float64) for _ in range(4)]
    torch.manual_seed(0)
    eager = [f(torch.as_tensor(x)) for x in items]
    after = torch.get_rng_state()
    torch.manual_seed(0)
    got = bf.batch_map(lambda x: f(torch.as_tensor(x)), items)
    assert torch.equal(torch.get_rng_state(), after)
    for g, e in zip(got, eager, strict=True):
        assert torch.equal(g == 0, e == 0)


def test_a_function_that_cannot_take_zeros_says_why_it_is_refused() -> None:
    """Shape inference runs it on zeros; the error blamed the inputs' shapes alone."""
    f = bf.function(torch.linalg.inv)  # singular at zeros
    items = [torch.eye(3, dtype=torch.float64) * 2 for _ in range(2)]
    with pytest.raises(bf.ShapeError) as raised:
        bf.batch_map(lambda x: f(torch.as_tensor(x)), items)
    assert any("runs once on zeros" in note for note in getattr(raised.value, "__notes__", []))


def test_rows_that_depend_on_each_other_are_found_with_integer_inputs_and_sorts() -> None:
    """Only floating inputs were varied (integer rows stayed equal), and rows in order hid a
    sort over dim 0."""
    table = nn.Embedding(10, 3).double()
    centred = bf.function(lambda i: table(i) - table(i).mean(0), batched=True)
    with pytest.raises(bf.ShapeError, match="depends on the other rows"):
        bf.batch_map(lambda i: centred(torch.tensor(i)), [1, 2, 3])
    ordered = bf.function(lambda x: torch.sort(x, 0).values, batched=True)
    with pytest.raises(bf.ShapeError, match="depends on the other rows"):
        bf.batch_map(lambda x: ordered(torch.as_tensor(x)), [torch.randn(2) for _ in range(3)])


def test_a_batched_function_that_draws_is_never_taken_for_one_that_mixes_rows() -> None:
    """Whether it draws was told by two calls' values: where neither dropped anything, the
    draws of the one-row calls were compared as rows (22% of seeds refused at p=0.02)."""
    lin = nn.Linear(4, 8).double()
    f = bf.function(lambda a: nn.functional.dropout(lin(a), 0.02, training=True), batched=True)
    items = [torch.randn(4, dtype=torch.float64) for _ in range(3)]
    for seed in range(30):
        torch.manual_seed(seed)
        bf.batch_map(lambda x: f(torch.as_tensor(x)), items)


def test_a_half_precision_batched_function_is_not_refused_for_its_rounding() -> None:
    """A bfloat16 GRU's batched and one-row outputs differ by one unit in the last place,
    beyond a fixed tolerance of 1e-3."""
    torch.manual_seed(0)
    gru = nn.GRU(32, 64, batch_first=True).to(torch.bfloat16)
    f = bf.function(lambda x: gru(x)[0], batched=True)
    items = [torch.randn(5, 32).to(torch.bfloat16) for _ in range(3)]
    got = bf.batch_map(lambda x: f(torch.as_tensor(x)), items)
    assert [tuple(g.shape) for g in got] == [(5, 64)] * 3
