"""The plan's structure: how many steps, what runs together, and deep graphs."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch

import batchfold as bf
from batchfold.schedule import Scheduler
from reference import assert_matches_eager


def complete(depth: int) -> Any:
    return 0 if depth == 0 else (complete(depth - 1), complete(depth - 1))


def encode(tree: Any) -> torch.Tensor:
    # one op per tree node: a leaf is a constant, an internal node one batched function
    if isinstance(tree, int):
        return torch.tensor([float(tree), 1.0])
    return combine(encode(tree[0]), encode(tree[1]))


combine = bf.function(lambda a, b: torch.tanh(a + 2 * b))


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_identical_complete_trees_run_one_step_per_level(scheduler: Scheduler) -> None:
    _, stats = bf.batch_map(encode, [complete(5)] * 8, scheduler=scheduler, return_stats=True)
    assert stats.plan is not None
    assert stats.steps == 5 + 1
    assert [len(step.nodes) for step in stats.plan.steps] == [8 * 2**d for d in range(5, -1, -1)]


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_steps_never_exceed_nodes(scheduler: Scheduler) -> None:
    rng = random.Random(0)

    def tree(n: int) -> Any:
        if n == 1:
            return rng.randrange(5)
        k = rng.randint(1, n - 1)
        return (tree(k), tree(n - k))

    trees = [tree(rng.randint(1, 30)) for _ in range(20)]
    _, stats = bf.batch_map(encode, trees, scheduler=scheduler, return_stats=True)
    assert stats.steps <= stats.nodes
    assert stats.plan is not None
    seen = np.concatenate([step.nodes for step in stats.plan.steps])
    assert sorted(seen.tolist()) == list(range(stats.nodes))  # every node exactly once


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_a_chain_of_ten_thousand_nodes(scheduler: Scheduler) -> None:
    def chain(n: int) -> torch.Tensor:
        x = torch.tensor(0.5)
        for _ in range(n):
            x = x * 0.999 + 0.001
        return x

    (out,), stats = bf.batch_map(chain, [10_000], scheduler=scheduler, return_stats=True)
    assert stats.nodes == 20_001
    torch.testing.assert_close(out, chain(10_000))


def test_agenda_prefers_cheap_ops_on_ties_and_lower_mean_depth() -> None:
    lin = torch.nn.Linear(2, 2)

    def fn(x: float) -> torch.Tensor:
        v = torch.tensor([x, x])
        return lin(v) + torch.tanh(v)  # linear and tanh are both ready at depth 1

    _, stats = bf.batch_map(fn, [1.0, 2.0], return_stats=True)
    assert stats.plan is not None
    assert [s.sig.name for s in stats.plan.steps] == ["tensor", "tanh", "linear", "add"]


def test_plan_snapshot() -> None:
    lin = torch.nn.Linear(3, 3)

    def fn(n: int) -> torch.Tensor:
        h = torch.zeros(3)
        for i in range(n):
            h = torch.tanh(lin(h) + torch.tensor(float(i)))
        return h

    _, stats = bf.batch_map(fn, [1, 3, 2], scheduler="depth", return_stats=True)
    assert str(stats.plan).splitlines() == [
        "Plan: 27 nodes in 11 steps (mean batch 2.5)",
        "step    0  zeros                  x3",
        "step    1  tensor                 x6",
        "step    2  linear                 x3      <- steps 0",
        "step    3  add                    x3      <- steps 1, 2",
        "step    4  tanh                   x3      <- steps 3",
        "step    5  linear                 x2      <- steps 4",
        "step    6  add                    x2      <- steps 1, 5",
        "step    7  tanh                   x2      <- steps 6",
        "step    8  linear                 x1      <- steps 7",
        "step    9  add                    x1      <- steps 1, 8",
        "step   10  tanh                   x1      <- steps 9",
    ]


def test_contiguous_inputs_are_views() -> None:
    def fn(x: float) -> torch.Tensor:
        return torch.tanh(torch.sigmoid(torch.tensor([x, 2 * x])))

    _, stats = bf.batch_map(fn, [1.0, 2.0, 3.0], return_stats=True)
    assert stats.plan is not None
    sigmoid, tanh = stats.plan.steps[-2:]
    assert [len(part) for part in tanh.gathers[0].parts] == [4]  # (step, output, start, stop)
    assert tanh.gathers[0].order is None and sigmoid.sig.name == "sigmoid"


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_an_output_read_by_several_steps_is_gathered_once(
    scheduler: Scheduler, float64: None
) -> None:
    lin = torch.nn.Linear(3, 3)

    def fn(x: list[float]) -> torch.Tensor:
        h = torch.tanh(lin(torch.tensor(x)))  # read by three different steps below
        return torch.sigmoid(h) + torch.exp(h) * torch.sin(2 * h)

    xs = [[1.0, 2.0, 3.0], [0.5, -1.0, 2.0], [0.0, 0.1, -0.2]]
    stats = assert_matches_eager(fn, xs, lin, scheduler)
    assert stats.plan is not None
    steps = stats.plan.steps
    tanh = next(step for step in steps if step.sig.name == "tanh")
    assert [(f.output, f.sizes) for f in tanh.fanouts] == [(0, (3, 3, 3))]
    reads = [p for s in steps for g in s.gathers for p in g.parts if p[0] == tanh.index]
    assert sorted(p[2] for p in reads) == [0, 1, 2]  # each reader takes its own chunk
    assert all(not step.fanouts for step in steps if step is not tanh)


def test_graph_lint_and_text() -> None:
    rec = bf.lazy.Recorder()
    with rec:
        rec.instance = 0
        x = torch.tensor([1.0, 2.0])
        y = torch.tanh(x)
        a, b = y.chunk(2)
        _ = a + b
    rec.graph.lint()
    assert str(rec.graph).splitlines() == [
        "node 0  tensor() -> float32[2]  depth 0  instance 0",
        "node 1  tanh(v0.0) -> float32[2]  depth 1  instance 0",
        "node 2  chunk(v1.0) -> float32[1], float32[1]  depth 2  instance 0",
        "node 3  add(v2.0, v2.1) -> float32[1]  depth 3  instance 0",
    ]


def test_unknown_scheduler_is_an_error() -> None:
    with pytest.raises(ValueError, match="scheduler must be 'agenda' or 'depth', got 'fifo'"):
        bf.batch_map(lambda x: torch.tensor(x), [1.0], scheduler="fifo")  # pyright: ignore[reportArgumentType]
