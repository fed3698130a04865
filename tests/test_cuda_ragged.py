"""On a CUDA device, ragged batching equals eager one-instance-at-a-time execution (float64).

The CPU tests' ragged workloads, moved to the GPU: module calls on sequences cached for every
length (an LSTM encoder, random chains of ops with ragged rules), a graph's nodes and edges of
two lengths, an adjacency read by ``A @ h``, the Weave model's per-molecule code, and a
per-instance number as an operand. Values and parameter gradients, both schedulers. The whole
module is skipped where CUDA is not available.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

if not torch.cuda.is_available():
    pytest.skip("CUDA is not available: these tests need a GPU", allow_module_level=True)

import batchfold as bf
from batchfold.models.weave import WeaveModel, weave_predict
from batchfold.schedule import Scheduler
from random_molecules import random_molecule
from test_ragged_lengths import SIZES, EdgeLayer, _graphs
from test_ragged_macros import (
    Encoder,
    MessagePassing,
    RandomSequenceModel,
    _nodes,
    _sequences,
    _weighted,
)

DEV = torch.device("cuda", 0)
SCHEDULERS: list[Scheduler] = ["agenda", "depth"]


@pytest.fixture(autouse=True)
def _deterministic_cublas(monkeypatch: pytest.MonkeyPatch) -> None:  # conftest's determinism
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def _on_gpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(DEV)
    if isinstance(value, tuple | list):
        return type(value)(_on_gpu(v) for v in value)
    return value


def _check(module: nn.Module, fn: Callable[[Any], Any], items: list[Any], scheduler: Scheduler):
    """batch_map of ``fn`` equals ``fn`` per item: values, devices, parameter gradients."""
    got, stats = bf.batch_map(fn, items, scheduler=scheduler, return_stats=True)
    want = [fn(item) for item in items]
    for g, w in zip(got, want, strict=True):
        assert g.device == w.device == DEV
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
    params = list(module.parameters())
    grads = torch.autograd.grad(_weighted(got), params, allow_unused=True)
    wants = torch.autograd.grad(_weighted(want), params, allow_unused=True)
    for g, w in zip(grads, wants, strict=True):
        assert (g is None) == (w is None)
        if g is not None:
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
    return stats


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_an_encoder_on_sequences_is_cached_and_equals_eager(scheduler: Scheduler) -> None:
    model = Encoder().double().to(DEV)
    xs = _on_gpu(_sequences())

    def fn(x: torch.Tensor) -> torch.Tensor:
        states, pooled = model(torch.as_tensor(x))
        return states.sum(0) * pooled

    stats = _check(model, fn, xs, scheduler)
    assert _nodes(stats, "Encoder") > 0


@pytest.mark.parametrize("seed", range(4))
def test_random_modules_on_sequences_equal_eager(seed: int) -> None:
    model = RandomSequenceModel(seed).double().to(DEV)
    rng = random.Random(seed)
    lengths = [rng.randint(1, 9) for _ in range(12)]

    def fn(x: torch.Tensor) -> torch.Tensor:
        rows, pooled = model(torch.as_tensor(x))
        return rows.sum(0) * pooled

    xs = _on_gpu(_sequences(seed=seed, lengths=lengths))
    _check(model, fn, xs, SCHEDULERS[seed % 2])


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_nodes_and_edges_of_two_lengths_equal_eager(scheduler: Scheduler) -> None:
    model = EdgeLayer().double().to(DEV)
    graphs = _on_gpu(_graphs(SIZES))
    stats = _check(model, lambda g: model(*(torch.as_tensor(x) for x in g)), graphs, scheduler)
    assert _nodes(stats, "EdgeLayer") == len(SIZES) - 2  # as in test_ragged_lengths


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_an_adjacency_read_by_a_product_equals_eager(scheduler: Scheduler) -> None:
    model = MessagePassing().double().to(DEV)
    gen = torch.Generator().manual_seed(6)
    graphs = [
        (x, (torch.rand(len(x), len(x), dtype=torch.float64, generator=gen) > 0.5).double())
        for x in _sequences(dim=8, seed=6, lengths=[3, 1, 5, 3, 2, 7, 4, 4])
    ]
    fn = lambda g: model(torch.as_tensor(g[0]), torch.as_tensor(g[1]))  # noqa: E731
    stats = _check(model, fn, _on_gpu(graphs), scheduler)
    assert _nodes(stats, "MessagePassing") > 0


@pytest.mark.parametrize("scheduler", SCHEDULERS)
@pytest.mark.parametrize("gather", ["sum", "gaussian"])
def test_weave_per_molecule_code_equals_eager(scheduler: Scheduler, gather: str) -> None:
    torch.manual_seed(1)
    weave = WeaveModel(n_tasks=2, atom_dim=6, pair_dim=5, gather_dim=4, hidden=3, gather=gather)
    weave = weave.double().to(DEV)
    rng = random.Random(1)
    batch = [random_molecule(rng, rng.randint(1, 7), rng.random() < 0.5) for _ in range(12)]
    _check(weave, lambda m: weave_predict(weave, m), batch, scheduler)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_per_instance_number_divides_as_eagerly(dtype: torch.dtype) -> None:
    module = nn.Linear(4, 1, bias=False, dtype=dtype, device=DEV)

    def loss(item: tuple[torch.Tensor, float]) -> torch.Tensor:
        x, target = item
        prediction = module(torch.as_tensor(x)).squeeze(0)
        return (prediction - target) ** 2 + prediction / target + target / (prediction + 3)

    items = [(torch.randn(4, dtype=dtype, device=DEV), t) for t in [0.37, -1.5, 2.0, 3, -7, 0.1]]
    got = bf.batch_map(loss, items)
    want = [loss(item) for item in items]
    for g, e in zip(got, want, strict=True):
        assert g.dtype == e.dtype == dtype and g.device == e.device == DEV
        torch.testing.assert_close(g, e)
    (grad,) = torch.autograd.grad(torch.stack(got).sum(), module.weight)
    (expected,) = torch.autograd.grad(torch.stack(want).sum(), module.weight)
    torch.testing.assert_close(grad, expected)
