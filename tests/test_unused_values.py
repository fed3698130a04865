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
