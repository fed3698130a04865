"""A run's signatures serve the next ``batch_map`` of the thread (``batchfold.lazy.graphs``):
found instead of made again, equal to eager execution, and never those that hold a tensor or
an object by identity."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest
import torch
from torch import nn

import batchfold as bf
from batchfold.graph import Graph
from batchfold.lazy import graphs
from batchfold.schedule import Scheduler


def _made(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the signatures made from now on."""
    made: list[str] = []
    original = Graph.signature

    def counted(self: Graph, key: object, **fields: object) -> object:
        made.append(str(fields["name"]))
        return original(self, key, **fields)

    monkeypatch.setattr(Graph, "signature", counted)
    return made


def _kept() -> list[Graph]:
    return [g for kept in graphs._free().values() for g in kept]


def _check_kept(graph: Graph) -> None:
    """A kept graph's invariants: ids in order, pools and families among the kept, no nodes."""
    for i, sig in enumerate(graph.signatures):
        assert sig.id == i
        if sig.keep is True:  # nothing held by identity
            assert not sig.shared
        else:  # a kept module call's member, while its macro is kept
            assert sig.keep() is not None and sig.name == "Pool"
        assert graph.signatures[sig.pool].pool == sig.pool
        assert sig.family is None or graph.signatures[sig.family.rep] is graph.signatures[sig.pool]
        assert graph.lookup(sig.key) is sig
    for family in graph.families.values():
        assert family.rep < len(graph.signatures)
    assert not graph.node_depth and not graph.touched and graph.node_base == 0
    assert all(not p.nodes for p in graph.pending_of)


def _sequences(lengths: list[int], seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(n, 4, dtype=torch.float64, generator=gen) for n in lengths]


class Pool(nn.Module):
    """A module on a whole sequence, then per-instance ops: a cached call and ragged ops."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x))


def _loss(model: Pool, w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    h = torch.relu(model(torch.as_tensor(x)))
    scores = torch.softmax(h @ w, dim=0)  # w: a tensor from outside, read by identity
    return (scores.unsqueeze(1) * h).sum(0).pow(2).sum()


def _run(model: Pool, w: torch.Tensor, xs: list[torch.Tensor], scheduler: Scheduler) -> bf.Stats:
    got, stats = bf.batch_map(
        lambda x: _loss(model, w, x), xs, scheduler=scheduler, return_stats=True
    )
    want = [_loss(model, w, x) for x in xs]
    params = [*model.parameters(), w]
    for g, e in zip(
        [*got, *torch.autograd.grad(torch.stack(got).sum(), params)],
        [*want, *torch.autograd.grad(torch.stack(want).sum(), params)],
        strict=True,
    ):
        torch.testing.assert_close(g, e)
    return stats


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_a_later_run_finds_the_signatures_of_lengths_seen_before(
    scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    model = Pool().double()
    w = torch.randn(4, dtype=torch.float64, requires_grad=True)
    first = _run(model, w, _sequences([3, 5, 2, 7, 4], seed=0), scheduler)
    (graph,) = _kept()
    _check_kept(graph)
    kept = {sig.name for sig in graph.signatures}
    assert {"as_tensor", "relu", "softmax"} <= kept  # ops on lazy values, sources
    assert not {"Pool", "matmul"} & kept  # a module's macro; an op reading w by identity
    made = _made(monkeypatch)
    with torch.no_grad():
        w.add_(0.5)  # changed between the runs, as an optimizer would: read anew
    # the first call of a kept module call is traced dry (see lazy/dry_trace.py): at a
    # length the first run traced, its ops' signatures are found too
    again = _run(model, w, _sequences([5, 2, 7, 3], seed=1), scheduler)
    assert not kept & set(made)  # every kept kind was found, not made
    assert again.steps <= first.steps
    _check_kept(_kept()[0])
    # the module call confirmed in an earlier run keeps its members from the second run on
    assert "Pool" in {sig.name for sig in _kept()[0].signatures}
    made.clear()
    with torch.no_grad():
        model.lin.weight.mul_(0.5)  # in place, as an optimizer step: seen
    _run(model, w, _sequences([5, 3, 7], seed=2), scheduler)
    assert made.count("Pool") == 0 and made.count("matmul") == 3
    _check_kept(_kept()[0])


def test_a_kept_module_call_goes_with_its_module() -> None:
    torch.manual_seed(2)
    w = torch.randn(4, dtype=torch.float64, requires_grad=True)
    model = Pool().double()
    for seed in range(3):  # traced and confirmed, then kept with the graph
        _run(model, w, _sequences([3, 5, 2], seed=seed), "depth")
    graph = _kept()[0]
    assert graph.macros and "Pool" in {sig.name for sig in graph.signatures}
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None  # the kept graph does not keep the module alive
    other = Pool().double()
    _run(other, w, _sequences([4, 6], seed=4), "depth")  # the next run drops its signatures
    assert not graph.macros and "Pool" not in {sig.name for sig in graph.signatures}
    _check_kept(graph)


def test_a_run_that_fails_leaves_a_clean_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(1)
    model = Pool().double()
    w = torch.randn(4, dtype=torch.float64, requires_grad=True)

    def fails(x: torch.Tensor) -> torch.Tensor:
        out = _loss(model, w, x)
        if x.shape[0] == 4:
            raise ValueError("stop")
        return out

    with pytest.raises(ValueError, match="stop"):
        bf.batch_map(fails, _sequences([3, 5, 4], seed=2))
    _check_kept(_kept()[0])
    _run(model, w, _sequences([3, 4, 6], seed=3), "agenda")


def test_views_kept_from_an_earlier_run_still_refuse_writes_through_them() -> None:
    def view(x: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(x).view(-1) * 2

    def write(x: torch.Tensor) -> torch.Tensor:
        x = torch.as_tensor(x) * 1
        flat = x.view(-1)
        flat.mul_(2)  # eager PyTorch changes x too
        return x

    xs = [torch.ones(2, 3), torch.ones(2, 3)]
    bf.batch_map(view, xs)
    assert any(sig.name == "view" for sig in _kept()[0].signatures)
    with pytest.raises(bf.UnsupportedOpError, match="view"):
        bf.batch_map(write, xs)
    graphs.forget()
    with pytest.raises(bf.UnsupportedOpError, match="view"):  # as on a new graph
        bf.batch_map(write, xs)


def test_runs_without_ragged_batching_keep_their_own_graph() -> None:
    xs = _sequences([2, 3, 4], seed=4)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.as_tensor(x)).sum(0)

    _, ragged = bf.batch_map(fn, xs, return_stats=True)
    _, exact = bf.batch_map(fn, xs, ragged=False, return_stats=True)
    assert ragged.steps == 3 and exact.steps == 9  # each length its own step without ragged
    assert len(_kept()) == 2


def test_each_thread_keeps_its_own_graphs() -> None:
    xs = _sequences([2, 5, 3], seed=5)
    fn = lambda x: torch.tanh(torch.as_tensor(x)).sum(0)  # noqa: E731
    bf.batch_map(fn, xs)
    mine = _kept()
    seen: list[list[Graph]] = []

    def other() -> None:
        got = bf.batch_map(fn, xs)
        torch.testing.assert_close(torch.stack(got), torch.stack([fn(x) for x in xs]))
        seen.append(_kept())

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert len(seen[0]) == 1 and seen[0][0] is not mine[0]


def test_a_run_under_another_default_dtype_takes_another_graph(float64: None) -> None:
    def fn(i: int) -> torch.Tensor:
        return torch.tensor(i) * 0.5 + torch.arange(3)  # int64 times a number: the default dtype

    torch.set_default_dtype(torch.float32)
    first = bf.batch_map(fn, [1, 2])
    torch.set_default_dtype(torch.float64)
    again = bf.batch_map(fn, [1, 2])
    assert first[0].dtype == torch.float32 and again[0].dtype == torch.float64 == fn(1).dtype
    torch.testing.assert_close(again[1], fn(2))
    assert len(_kept()) == 2


def test_a_blocks_model_with_per_instance_code_leaves_the_kept_graph_alone() -> None:
    from batchfold.blocks import Function, Vector, compile

    fn = lambda x: torch.tanh(torch.as_tensor(x)).sum(0)  # noqa: E731
    bf.batch_map(fn, _sequences([2, 3], seed=6), ragged=False)  # as block graphs record
    (kept,) = _kept()
    model = compile(Vector(2) >> Function(lambda h: torch.relu(h) * 2, per_instance=True))
    model([[1.0, -2.0], [3.0, 4.0]])
    assert _kept() == [kept]  # its recorder records into the block graph, not a kept one
