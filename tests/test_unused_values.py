"""Values computed and never used are left out of the last plan, as eager code drops them.

Batched, an unused value's node shared a step with used ones, and the step's backward ran
through its rows: a non-finite local derivative (tanh of a logsumexp over 0 rows) times its
zero gradient made the shared weights' gradient NaN, where eagerly they get none.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import batchfold as bf

pytestmark = pytest.mark.usefixtures("float64")
SCHEDULERS = ["agenda", "depth"]


@pytest.mark.parametrize("scheduler", SCHEDULERS)
@pytest.mark.parametrize("ragged", [True, False])
def test_an_unused_value_leaves_no_nan_in_a_weights_gradient(scheduler: str, ragged: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    w, v = (torch.randn(3, 3, generator=gen, requires_grad=True) for _ in range(2))

    def fn(x: torch.Tensor) -> torch.Tensor:
        h = torch.as_tensor(x)
        unused = torch.tanh(h.logsumexp(0) @ w)  # -inf @ w: NaN for 0 rows; never returned
        del unused
        return torch.tanh(h.sum(0) @ v)

    items = [torch.randn(n, 3, generator=gen) for n in (2, 0, 3)]
    eager = [fn(x) for x in items]
    got, stats = bf.batch_map(fn, items, scheduler=scheduler, ragged=ragged, return_stats=True)  # type: ignore[arg-type]
    for g, e in zip(got, eager, strict=True):
        torch.testing.assert_close(g, e, rtol=0, atol=1e-12)
    want = torch.autograd.grad(torch.stack(eager).sum(), [w, v], allow_unused=True)
    grads = torch.autograd.grad(torch.stack(got).sum(), [w, v], allow_unused=True)
    assert want[0] is None and grads[0] is None
    assert grads[1] is not None and want[1] is not None
    torch.testing.assert_close(grads[1], want[1], rtol=0, atol=1e-12)
    assert stats.unused == 3 * 3  # logsumexp, matmul and tanh of each instance
    assert "nodes left out" in str(stats)


def test_what_an_unused_value_needs_still_runs_where_a_result_needs_it_too() -> None:
    layer = nn.Linear(3, 3).double()

    def fn(x: list[float]) -> Any:
        h = layer(torch.tensor(x))
        torch.sigmoid(h)  # unused
        return torch.tanh(h)

    items = [[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]]
    got, stats = bf.batch_map(fn, items, return_stats=True)
    for g, x in zip(got, items, strict=True):
        torch.testing.assert_close(g, fn(x), rtol=0, atol=1e-12)
    assert stats.unused == 2  # the two sigmoids; the layer's outputs feed the results


def test_an_unused_normalisation_still_moves_its_running_statistics() -> None:
    norm = nn.BatchNorm1d(3).double()
    eager_norm = nn.BatchNorm1d(3).double()

    def make(layer: nn.Module) -> Any:
        def fn(x: torch.Tensor) -> torch.Tensor:
            h = torch.as_tensor(x)
            layer(h)  # unused, but eagerly it moves the running mean and variance
            return h.sum()

        return fn

    gen = torch.Generator().manual_seed(1)
    items = [torch.randn(4, 3, generator=gen) for _ in range(3)]
    for x in items:
        make(eager_norm)(x)
    bf.batch_map(make(norm), items)
    assert norm.running_mean is not None and eager_norm.running_mean is not None
    torch.testing.assert_close(norm.running_mean, eager_norm.running_mean, rtol=0, atol=1e-12)


def test_unused_values_before_a_sync_point_still_run() -> None:
    layer = nn.Linear(2, 2).double()

    def fn(x: list[float]) -> Any:
        h = layer(torch.tensor(x))
        torch.exp(h)  # unused, recorded before the read below: its segment runs it
        n = int(h.argmax())  # a sync point
        return h[n]

    items = [[1.0, 2.0], [3.0, -4.0]]
    got, stats = bf.batch_map(fn, items, return_stats=True)
    for g, x in zip(got, items, strict=True):
        torch.testing.assert_close(g, fn(x), rtol=0, atol=1e-12)
    assert stats.syncs == 1 and stats.unused == 0


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_an_unused_value_still_raises_the_error_eager_code_raises(scheduler: str) -> None:
    table = nn.Embedding(4, 2)

    def fn(i: int) -> torch.Tensor:
        t = torch.tensor(i)
        table(t)  # unused: an index out of range for i >= 4, which eager code raises
        return table(t % 4).sum()

    with pytest.raises(IndexError):
        fn(9)
    with pytest.raises(IndexError):
        bf.batch_map(fn, [1, 9], scheduler=scheduler)  # type: ignore[arg-type]
    got = bf.batch_map(fn, [1, 3], scheduler=scheduler)  # type: ignore[arg-type]
    assert [g.item() for g in got] == [fn(1).item(), fn(3).item()]


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_an_unused_random_value_still_draws_as_eagerly(scheduler: str) -> None:
    """Left out, an unused dropout drew nothing: the generator's state after the run, and
    every later draw, differed from eager's."""

    def fn(x: torch.Tensor) -> torch.Tensor:
        h = torch.as_tensor(x) * 1
        kept = torch.nn.functional.dropout(h, 0.5)
        return kept if float(x[0, 0]) != 2.0 else h  # instance 1 leaves its draw unused

    items = [torch.ones(3, 4), torch.full((3, 4), 2.0), torch.ones(3, 4)]
    torch.manual_seed(123)
    eager = [fn(x) for x in items]
    after = torch.get_rng_state()
    torch.manual_seed(123)
    got = bf.batch_map(fn, items, scheduler=scheduler)  # type: ignore[arg-type]
    assert torch.equal(torch.get_rng_state(), after)
    for g, e in zip(got, eager, strict=True):
        assert torch.equal(g, e)


def test_an_attribute_set_over_by_a_later_instance_is_unused() -> None:
    """Only the last instance's value stays on the module, as eagerly; the others' are
    unused (they were kept, and made a weight's gradient NaN)."""
    holder = nn.Module()
    gen = torch.Generator().manual_seed(0)
    w, v = (torch.randn(3, 3, generator=gen, requires_grad=True) for _ in range(2))

    def fn(x: torch.Tensor) -> torch.Tensor:
        h = torch.as_tensor(x)
        holder.keep = torch.tanh(h.logsumexp(0) @ w)  # -inf for 0 rows: set over below
        return torch.tanh(h.sum(0) @ v)

    items = [torch.randn(n, 3, generator=gen) for n in (2, 0, 3)]
    got, stats = bf.batch_map(fn, items, return_stats=True)
    kept = holder.keep
    assert isinstance(kept, torch.Tensor)  # the last instance's value, computed
    torch.testing.assert_close(kept, torch.tanh(items[-1].logsumexp(0) @ w), rtol=0, atol=1e-12)
    grad = torch.autograd.grad(torch.stack(got).sum(), [w], allow_unused=True)[0]
    assert grad is None or bool(torch.isfinite(grad).all())
    assert stats.unused == 2 * 3


def test_the_rehearsal_runs_only_the_values_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """It ran every pending node again: a recurrence whose last cell state goes unused ran
    its forward pass twice."""
    import importlib

    execute = importlib.import_module("batchfold.execute")
    run_steps = execute.Executor._run_steps
    counts: list[int] = []

    def counting(self: Any, plan: Any) -> None:
        counts.append(len(plan.steps))
        run_steps(self, plan)

    monkeypatch.setattr(execute.Executor, "_run_steps", counting)
    cell = nn.LSTMCell(3, 3).double()

    def fn(x: torch.Tensor) -> torch.Tensor:
        xs = torch.as_tensor(x)
        h = c = torch.zeros(3, dtype=torch.float64)
        for t in range(xs.shape[0]):
            h, c = cell(xs[t][None], (h[None], c[None]))
            h, c = h[0], c[0]
        return torch.tanh(h).sum()  # the last c[0] goes unused

    items = [torch.randn(6, 3, dtype=torch.float64) for _ in range(4)]
    got, stats = bf.batch_map(fn, items, return_stats=True)
    for g, x in zip(got, items, strict=True):
        torch.testing.assert_close(g, fn(x), rtol=0, atol=1e-12)
    assert stats.unused > 0 and len(counts) == 2
    assert counts[1] < counts[0] // 2  # the left-out values' steps only


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_unused_values_beside_grad_modes_writes_and_half_precision(scheduler: str) -> None:
    """The pass that leaves unused values out, against eager: an unused value made under
    no_grad beside a used one, a write into a returned value of a value used nowhere else,
    unused arithmetic on the value before the write, and half precision."""
    from reference import assert_matches_eager

    layer = nn.Linear(3, 3).double()

    def fn(x: list[float]) -> Any:
        h = layer(torch.tensor(x))
        with torch.no_grad():
            torch.exp(h)  # unused, made without gradients
        g = h * 2
        part = g[:2] * 3  # unused once written: g's new value reads it
        g[:2] = part  # a write into a returned value
        g[2:] * 5  # unused view arithmetic on the old g
        torch.tanh(h.half())  # unused, half precision
        return g, h.half() * 2

    items = [[1.0, 2.0, 3.0], [0.5, -1.0, 2.0], [0.0, 0.0, 1.0]]
    stats = assert_matches_eager(fn, items, layer, scheduler)  # type: ignore[arg-type]
    assert stats.unused > 0
