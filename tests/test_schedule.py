"""The plan's structure: how many steps, what runs together, and deep graphs."""

from __future__ import annotations

import importlib
import random
from typing import Any

import numpy as np
import pytest
import torch

import batchfold as bf
from batchfold import grouping
from batchfold.graph import Graph, Signature, TensorMeta
from batchfold.ops import OpRule
from batchfold.schedule import Plan, Scheduler, schedule
from reference import assert_matches_eager
from schedule_reference import reference_agenda, reference_schedule

schedule_module = importlib.import_module(
    "batchfold.schedule"
)  # the package exports a function by that name


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


# Plans and groups equal to the reference scheduler's (the pre-O(n log n) code, verbatim) on
# random graphs built directly, in one or two segments, through the Python and NumPy paths.


def _never(sig: Signature, inputs: list[torch.Tensor], n: int) -> Any:
    raise AssertionError("never run")


def random_graph(rng: random.Random, instances: int, length: int) -> Graph:
    """Instances that mostly follow one random program (so groups are wide), some ops random;
    signatures of 0-3 inputs and 1-2 outputs, cheap or not; inputs often read twice."""
    graph = Graph()
    meta = TensorMeta.of((2,), torch.float32, torch.device("cpu"))
    sigs = []
    for i in range(rng.randint(1, 6)):
        width, outs = rng.randint(0, 3) if i else 0, rng.randint(1, 2)
        rule = OpRule(f"op{i}", _never, cheap=rng.random() < 0.5)
        sigs.append(
            graph.signature(
                i, func=_never, rule=rule, name=f"op{i}", in_metas=(meta,) * width,
                out_metas=(meta,) * outs, multi=tuple if outs > 1 else None,
            )
        )  # fmt: skip
    sources = [sig for sig in sigs if not sig.in_metas]
    program = [(rng.choice(sigs), [rng.random() for _ in range(3)]) for _ in range(length)]
    extend_random_graph(graph, rng, instances, program, sources, [])
    return graph


def extend_random_graph(
    graph: Graph,
    rng: random.Random,
    instances: int,
    program: list[tuple[Signature, list[float]]],
    sources: list[Signature],
    old: list[int],
) -> list[int]:
    """Record ``program`` for each instance (reading ``old`` values too); returns all values."""
    values = list(old)
    for instance in range(instances):
        mine = [value for value in old if rng.random() < 0.3]
        for sig, picks in program:
            if rng.random() < 0.15:
                sig, picks = rng.choice(graph.signatures), [rng.random() for _ in range(3)]
            if not mine and sig.in_metas:
                sig = rng.choice(sources)
            if sig.in_metas and rng.random() < 0.05 and values:
                ins = [rng.choice(values) for _ in sig.in_metas]  # another instance's value
            else:
                ins = [mine[int(p * len(mine))] for p in picks[: len(sig.in_metas)]]
            first = graph.add(sig, ins, instance, payload=0.0 if not sig.in_metas else None)
            mine += [first + out for out in range(len(sig.out_metas))]
        values += mine
    return values


def describe(plan: Plan) -> list[Any]:
    """A plan as nested lists, arrays as ("array", dtype, values), for exact comparison."""

    def value(x: Any) -> Any:
        if isinstance(x, np.ndarray):
            return ("array", str(x.dtype), x.tolist())
        return x

    steps = [
        (
            step.index,
            step.sig.id,
            value(step.nodes),
            [([tuple(map(value, part)) for part in g.parts], value(g.order)) for g in step.gathers],
            [(f.output, value(f.rows), f.sizes) for f in step.fanouts],
        )
        for step in plan.steps
    ]
    return [plan.node_base, value(plan.node_step), value(plan.node_row), steps]


PATHS = {"default": None, "python": 10**9, "numpy": 0}


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
@pytest.mark.parametrize("seed", range(12))
def test_plans_equal_the_reference_schedulers(
    scheduler: Scheduler, seed: int, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if PATHS[path] is not None:
        monkeypatch.setattr(grouping, "SMALL_BATCH", PATHS[path])
        monkeypatch.setattr(grouping, "SMALL_GRAPH", PATHS[path])
        monkeypatch.setattr(schedule_module, "SMALL_GROUP", PATHS[path])
    rng = random.Random(seed)
    graph = random_graph(rng, rng.choice([1, 2, 5, 90]), rng.randint(1, 40))
    graph.lint()
    plan = schedule(graph, scheduler)
    assert describe(plan) == describe(reference_schedule(graph, scheduler))
    # a second segment, reading values of the first
    old = [node << 16 for node in range(graph.pending)]
    graph.clear_pending()
    program = [(rng.choice(graph.signatures), [rng.random() for _ in range(3)]) for _ in range(9)]
    sources = [sig for sig in graph.signatures if not sig.in_metas]
    extend_random_graph(graph, rng, rng.choice([1, 3, 80]), program, sources, old)
    at = (len(plan.steps), (plan.node_step, plan.node_row))
    assert describe(schedule(graph, scheduler, *at)) == describe(
        reference_schedule(graph, scheduler, *at)
    )


@pytest.mark.parametrize("small_graph", [0, 10**9])
@pytest.mark.parametrize("small_batch", [0, 3, 10**9])
@pytest.mark.parametrize("seed", range(30))
def test_agenda_groups_equal_the_reference_rule(
    seed: int, small_batch: int, small_graph: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(grouping, "SMALL_BATCH", small_batch)
    monkeypatch.setattr(grouping, "SMALL_GRAPH", small_graph)
    rng = random.Random(seed)
    graph = random_graph(rng, rng.choice([1, 3, 40]), rng.randint(1, 60))
    sig_of, depth, members = graph.pending_arrays()
    inputs = {
        sig: np.asarray(graph.pending_of[sig].inputs, dtype=np.int64).reshape(len(local), -1)
        for sig, local in members.items()
    }
    expensive = np.array([not sig.rule.cheap for sig in graph.signatures], dtype=np.int64)
    edges = grouping.pending_edges(members, inputs, graph.node_base)
    order, bounds = grouping.by_agenda(sig_of, depth, expensive, *edges)
    groups = [order[a:b].tolist() for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    want = reference_agenda(graph, sig_of, depth, members, inputs)
    assert groups == [group.tolist() for group in want]


@pytest.mark.parametrize("big", [False, True])
def test_entries_sort_by_input_source_and_row(big: bool) -> None:
    rng = np.random.default_rng(0)
    input_of = np.sort(rng.integers(0, 50, 2000))
    src = rng.integers(0, 4, 2000) << (40 if big else 16)  # big: one key would overflow
    row = rng.integers(0, 1 << 20, 2000) // rng.integers(1, 1 << 20, 2000)  # ties too
    got = grouping.sort_by_input_source_row(input_of, src, row)
    np.testing.assert_array_equal(got, np.lexsort((row, src, input_of)))


def test_an_empty_graph_has_an_empty_plan() -> None:
    for scheduler in ("agenda", "depth"):
        plan = schedule(Graph(), scheduler)  # pyright: ignore[reportArgumentType]
        assert plan.steps == [] and plan.num_nodes == 0


# Values equal eager execution on random programs: per instance a random mix of ops over a
# chain of random length, so steps have 1 to many rows, read several outputs, and fan out.


class RandomNet(torch.nn.Module):
    def __init__(self, dim: int = 3) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(dim, dim)
        self.split = torch.nn.Linear(dim, 2 * dim)

    def forward(self, seed: int) -> torch.Tensor:
        rng = random.Random(seed)
        values = [torch.tensor([0.1 * seed, 0.5, -0.2])]
        for _ in range(rng.randint(1, 30)):
            a, b = rng.choice(values[-3:]), rng.choice(values)
            op = rng.randrange(6)
            if op == 0:
                values.append(torch.tanh(self.lin(a)))
            elif op == 1:
                values += list(self.split(a).chunk(2))
            elif op == 2:
                values.append(a * b + torch.sigmoid(a))
            elif op == 3:
                values.append(a - 0.5 * b)
            elif op == 4:
                values.append(torch.sin(a) + torch.tensor(float(seed % 3)))
            else:
                values.append(torch.stack([a, b, a]).mean(0))
        return torch.stack(values[-2:]).sum(0) + values[len(values) // 2]


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
@pytest.mark.parametrize("seed", range(4))
def test_random_programs_match_eager(scheduler: Scheduler, seed: int, float64: None) -> None:
    rng = random.Random(seed)
    model = RandomNet()
    seeds = [rng.randrange(8) for _ in range(rng.choice([1, 3, 12]))]  # repeats: wide steps
    assert_matches_eager(model, seeds, model, scheduler)


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_chains_of_different_lengths_match_eager(scheduler: Scheduler, float64: None) -> None:
    lin = torch.nn.Linear(2, 2)

    def rnn(n: int) -> torch.Tensor:
        h = torch.zeros(2)
        for i in range(n):
            h = torch.tanh(lin(h) + 0.01 * i) * h.sigmoid()
        return h

    stats = assert_matches_eager(rnn, [40, 3, 100, 41, 101], lin, scheduler)
    assert stats.plan is not None
    # the per-step numbers 0.01 * i are read per instance from one source step
    assert {len(s.nodes) for s in stats.plan.steps if s.sig.source is None} == {1, 2, 3, 4, 5}
