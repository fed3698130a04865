"""Module calls on ragged inputs of several lengths (a graph's nodes and its edges), cached once
for every combination of lengths, equal eager execution.

Values and gradients in float64 against the same module called one instance at a time, both
schedulers, random sizes including 1 and 0.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import torch
from torch import nn

import batchfold as bf
from batchfold.lazy.kept import forget, kept, kept_keys
from batchfold.lazy.ragged_macros import EMPTY
from batchfold.schedule import Scheduler
from fast_path import count_fast_path, no_fast_path, plan_steps

Graph = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # nodes [n, 3], edges [m, 2], ends [m, 2]


def _graphs(sizes: list[tuple[int, int]], seed: int = 0) -> list[Graph]:
    gen = torch.Generator().manual_seed(seed)
    graphs = []
    for n, m in sizes:
        nodes = torch.randn(n, 3, dtype=torch.float64, generator=gen)
        edges = torch.randn(m, 2, dtype=torch.float64, generator=gen)
        ends = torch.randint(0, max(n, 1), (m, 2), generator=gen)
        graphs.append((nodes, edges, ends))
    return graphs


class EdgeLayer(nn.Module):
    """Edges from their end nodes, nodes from their edges summed, a sum readout: ``[3]``."""

    def __init__(self) -> None:
        super().__init__()
        self.node = nn.Linear(3, 3)
        self.edge = nn.Linear(2 + 6, 3)
        self.out = nn.Linear(3, 3)

    def forward(self, nodes: torch.Tensor, edges: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        first, second = ends[:, 0], ends[:, 1]
        pair = torch.cat([edges, nodes.index_select(0, first), nodes[second]], dim=-1)
        messages = torch.tanh(self.edge(pair))
        h = torch.relu(self.node(nodes))
        h = h + torch.zeros_like(h).index_add(0, second, messages)
        return self.out(torch.softmax(h, dim=0) * h).sum(0)


def _check(model: nn.Module, graphs: list[Graph], scheduler: Scheduler = "depth") -> bf.Stats:
    fn = lambda g: model(*(torch.as_tensor(x) for x in g))  # noqa: E731
    got, stats = bf.batch_map(fn, graphs, scheduler=scheduler, return_stats=True)
    want = [fn(g) for g in graphs]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    params = list(model.parameters())
    weigh = lambda outs: torch.stack([(i + 1) * o.sum() for i, o in enumerate(outs)]).sum()  # noqa: E731
    grads = torch.autograd.grad(weigh(got), params)
    for g, w in zip(grads, torch.autograd.grad(weigh(want), params), strict=True):
        torch.testing.assert_close(g, w)
    return stats


SIZES = [(3, 5), (1, 2), (4, 1), (6, 9), (2, 7), (5, 5), (3, 8), (7, 2)]


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_a_call_on_nodes_and_edges_is_one_node_for_every_pair_of_lengths(
    scheduler: Scheduler,
) -> None:
    torch.manual_seed(0)
    model = EdgeLayer().double()
    stats = _check(model, _graphs(SIZES), scheduler)
    # (3, 5) and (1, 2) are traced and confirm the rest; (5, 5), whose two lengths are one,
    # takes the call of two lengths
    assert stats.module_calls_cached == len(SIZES) - 2
    assert stats.plan is not None
    calls = [s for s in stats.plan.steps if s.sig.name == "EdgeLayer"]
    assert len(calls) == 1 and len(calls[0].nodes) == len(SIZES) - 2


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_graphs_with_as_many_edges_as_nodes_take_the_call_of_two_lengths(
    scheduler: Scheduler,
) -> None:
    torch.manual_seed(2)
    model = EdgeLayer().double()
    sizes = [(2, 2), (3, 5), (1, 1), (1, 2), (4, 4), (6, 2), (3, 3)]
    stats = _check(model, _graphs(sizes), scheduler)
    # (2, 2) and (1, 1) come before (3, 5) and (1, 2) confirm the call of two lengths
    assert stats.module_calls_cached == len(sizes) - 4
    # in a later batch_map, equal lengths first: every call is one node of one step
    stats = _check(model, _graphs([(4, 4), (1, 1), (5, 3), (2, 2), (7, 7)], seed=3), scheduler)
    assert stats.module_calls_cached == 5 and stats.module_calls_traced == 0
    assert stats.plan is not None
    assert [len(s.nodes) for s in stats.plan.steps if s.sig.name == "EdgeLayer"] == [5]


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_the_fast_path_of_calls_on_nodes_and_edges_makes_the_plan_of_the_slow_one(
    scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    forget()
    torch.manual_seed(4)
    model = EdgeLayer().double()
    graphs = _graphs([*SIZES, (2, 2), (4, 0), (3, 3), (6, 4), (1, 1)], seed=7)
    taken = count_fast_path(monkeypatch)
    with_fast = _check(model, graphs, scheduler)
    assert sum(taken) >= len(SIZES) - 2, taken  # the calls of distinct lengths after the first two
    forget()
    no_fast_path(monkeypatch)
    slow = _check(model, graphs, scheduler)
    assert plan_steps(with_fast) == plan_steps(slow)
    assert with_fast.module_calls_cached == slow.module_calls_cached == len(graphs) - 2


def test_a_replay_drops_each_value_after_its_last_reader_and_keeps_the_outputs() -> None:
    forget()
    torch.manual_seed(5)
    model = EdgeLayer().double()
    _check(model, _graphs(SIZES, seed=8))
    (key,) = kept_keys(model)
    template = kept(key, model)[0]
    release = template.dropped_after
    outputs = {j for _, j, _ in template.outputs}
    dropped = [j for done in release for j in done]
    assert len(dropped) == len(set(dropped)) and not outputs & set(dropped)
    assert len(dropped) + len(outputs) == len(template.ops)  # every other value is dropped
    for k, done in enumerate(release):
        for j in done:  # never read after op k
            assert j <= k and all(
                r[0] == 0 or r[1] != j for _, refs, _ in template.ops[k + 1 :] for r in refs
            )


def test_a_later_batch_map_replays_the_call_for_graphs_of_equal_and_new_sizes() -> None:
    torch.manual_seed(1)
    model = EdgeLayer().double()
    _check(model, _graphs(SIZES))
    # one step of equal sizes (its uniform rule), and sizes never seen, empty edges too
    stats = _check(model, _graphs([(4, 6), (4, 6), (4, 6)], seed=1))
    assert stats.module_calls_cached == 3
    stats = _check(model, _graphs([(2, 0), (9, 3), (1, 4), (8, 30)], seed=2))
    assert stats.module_calls_cached == 4  # (2, 0) too: no edges, a sum of none is zeros
    assert not stats.module_misses


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_graphs_without_edges_take_the_cached_call(scheduler: Scheduler) -> None:
    torch.manual_seed(3)
    model = EdgeLayer().double()
    sizes = [(3, 5), (1, 2), (2, 0), (4, 6), (1, 0), (5, 0), (2, 0)]
    stats = _check(model, _graphs(sizes, seed=4), scheduler)
    assert stats.module_calls_cached == len(sizes) - 2 and not stats.module_misses
    # a batch of edgeless graphs only: one step of equal lengths, (2, 0) twice, and (1, 0)
    stats = _check(model, _graphs([(2, 0), (2, 0), (1, 0)], seed=5), scheduler)
    assert stats.module_calls_cached == 3 and stats.module_calls_traced == 0


class EdgeReduce(nn.Module):
    """Node states summed plus the edge states reduced by ``reduce`` (of none for a graph
    without edges): ``x.sum()`` gives zeros, ``x.amax(0)`` is refused by eager PyTorch and
    ``x.mean(0)`` is NaN."""

    def __init__(self, reduce: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.node = nn.Linear(3, 2)
        self.edge = nn.Linear(2, 2)
        self.reduce = reduce

    def forward(self, nodes: torch.Tensor, edges: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        return self.node(nodes).sum(0) + self.reduce(self.edge(edges))


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_a_step_of_graphs_without_edges_only_sums_none(scheduler: Scheduler) -> None:
    forget()
    torch.manual_seed(6)
    model = EdgeReduce(torch.sum).double()
    # the first two calls confirm the trace (op by op); the cached step holds no edge at all
    stats = _check(model, _graphs([(3, 5), (1, 2), (2, 0), (4, 0)], seed=9), scheduler)
    assert stats.module_calls_cached == 2
    # a later call: graphs without edges only, of two lengths and then of one (its uniform rule)
    stats = _check(model, _graphs([(2, 0), (4, 0), (2, 0)], seed=10), scheduler)
    assert stats.module_calls_cached == 3
    assert _check(model, _graphs([(2, 0), (2, 0)], seed=11), scheduler).module_calls_cached == 2


def test_a_mean_over_no_edges_is_recorded_op_by_op_and_is_nan_as_eagerly() -> None:
    forget()
    torch.manual_seed(7)
    model = EdgeReduce(lambda x: x.mean(0)).double()
    fn = lambda g: model(*(torch.as_tensor(x) for x in g))  # noqa: E731
    _check(model, _graphs(SIZES, seed=12))  # confirmed
    graphs = _graphs([(3, 2), (2, 0), (4, 5)], seed=13)
    got, stats = bf.batch_map(fn, graphs, return_stats=True)
    for g, x in zip(got, graphs, strict=True):
        torch.testing.assert_close(g, fn(x), equal_nan=True)
    assert bool(got[1].isnan().all()) and stats.module_calls_cached == 2
    # the call, and the layers it then calls on no edges, each named with the reason
    assert f"EdgeReduce: {EMPTY}" in stats.module_misses
    assert {reason.split(": ", 1)[1] for reason in stats.module_misses} == {EMPTY}


def test_a_graph_without_edges_is_not_replayed_where_eager_refuses_it() -> None:
    torch.manual_seed(0)
    model = EdgeReduce(lambda x: x.amax(0)).double()
    fn = lambda g: model(*(torch.as_tensor(x) for x in g))  # noqa: E731
    _check(model, _graphs(SIZES))  # confirmed
    graphs = _graphs([(3, 2), (2, 0)], seed=6)
    with pytest.raises(IndexError, match="non-zero size"):
        fn(graphs[1])
    with pytest.raises(bf.ShapeError, match=r"amax .*zero-size(.|\n)*instance 1 of batch_map"):
        bf.batch_map(fn, graphs)
    # where no graph lacks edges, the call is cached as before
    assert _check(model, _graphs([(3, 2), (2, 1)], seed=6)).module_calls_cached == 2


@pytest.mark.parametrize("seed", range(4))
def test_random_graphs_equal_eager(seed: int) -> None:
    rng = random.Random(seed)
    torch.manual_seed(seed)
    model = EdgeLayer().double()
    sizes = [(rng.randint(1, 6), rng.randint(0, 12)) for _ in range(rng.randint(1, 12))]
    _check(model, _graphs(sizes, seed), rng.choice(["agenda", "depth"]))


def test_an_index_out_of_range_is_refused_as_eagerly() -> None:
    torch.manual_seed(0)
    model = EdgeLayer().double()
    graphs = _graphs(SIZES)
    _check(model, graphs)
    nodes, edges, ends = graphs[3]
    bad = ends.clone()
    bad[2, 1] = nodes.shape[0]
    graphs[3] = (nodes, edges, bad)
    with pytest.raises(IndexError, match="out of range"):
        bf.batch_map(lambda g: model(*(torch.as_tensor(x) for x in g)), graphs)


class EdgeStates(nn.Module):
    """Returns new edge states: rows of the second length, which a node cannot hand back."""

    def __init__(self) -> None:
        super().__init__()
        self.edge = nn.Linear(2 + 3, 2)

    def forward(self, nodes: torch.Tensor, edges: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        return self.edge(torch.cat([edges, nodes.index_select(0, ends[:, 0])], dim=-1))


def test_a_call_returning_rows_of_its_second_length_is_recorded_op_by_op() -> None:
    torch.manual_seed(0)
    model = EdgeStates().double()
    stats = _check(model, _graphs(SIZES))
    assert stats.plan is not None
    assert not [s for s in stats.plan.steps if s.sig.name == "EdgeStates"]  # its Linear is
    assert any("EdgeStates" in r and "another length" in r for r in stats.module_misses)


class EdgeCount(nn.Module):
    """Takes another path for graphs of many edges: a guard on the second length."""

    def __init__(self) -> None:
        super().__init__()
        self.node = nn.Linear(3, 2)

    def forward(self, nodes: torch.Tensor, edges: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        h = self.node(nodes).sum(0)
        if edges.shape[0] > 6:
            return h + edges.sum(0)
        return h - edges.sum(0)


def test_a_branch_on_the_second_length_is_guarded() -> None:
    torch.manual_seed(0)
    model = EdgeCount().double()
    stats = _check(model, _graphs([(2, 3), (4, 5), (3, 9), (5, 1), (6, 8), (4, 4), (7, 7)]))
    # (5, 1) and (4, 4); (3, 9), (6, 8) and (7, 7) answer otherwise
    assert stats.module_calls_cached == 2


class _UsesLength(nn.Module):
    """Uses its sequence's length as a number, as positional codes and scaled sums do."""

    def __init__(self, use: str) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.use = use

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        if self.use == "arange":
            return torch.arange(x.size(0), dtype=h.dtype) @ h
        if self.use == "linspace":
            return torch.linspace(0.0, 1.0, x.size(0), dtype=h.dtype) @ h
        return h.sum(0) * x.shape[0] ** 0.5 / (0.5 * x.size(0) + 1)


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("use", ["arange", "linspace", "float arithmetic"])
def test_a_traced_calls_length_as_a_number_in_factories_and_float_arithmetic(use: str) -> None:
    """A ragged length handed to ``torch.arange`` or ``torch.linspace`` met PyTorch's argument
    parser (a ``TypeError``), and ``n ** 0.5`` or ``0.5 * n`` a ``TypeError`` from ``int``'s
    own methods; now each is the number, and the call is recorded op by op."""
    torch.manual_seed(0)
    module = _UsesLength(use)

    def fn(x: torch.Tensor) -> list[torch.Tensor]:
        return [module(torch.as_tensor(x) * k) for k in (1.0, 2.0, 3.0)]

    items = [torch.randn(length, 4) for length in (1, 5, 2, 6, 3)]
    got, stats = bf.batch_map(fn, items, return_stats=True)
    for g, w in zip(got, [fn(x) for x in items], strict=True):
        for a, b in zip(g, w, strict=True):
            torch.testing.assert_close(a, b)
    assert any("uses the length" in reason for reason in stats.module_misses)
