"""batch_map equals eager per-instance execution on random trees, DAGs and sequences."""

from __future__ import annotations

import copy
import dataclasses
import random
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import batchfold as bf
from batchfold.lazy import recorder as recorder_module
from batchfold.schedule import Scheduler
from reference import assert_matches_eager

SCHEDULERS = ["agenda", "depth"]
pytestmark = pytest.mark.usefixtures("float64")


def random_tree(rng: random.Random, leaves: int, vocab: int = 20) -> Any:
    """A nested-tuple binary tree with int leaves."""
    if leaves == 1:
        return rng.randrange(vocab)
    split = rng.randint(1, leaves - 1)
    return (random_tree(rng, split, vocab), random_tree(rng, leaves - split, vocab))


class TreeLSTM(nn.Module):
    """A binary Tree-LSTM written for one tree at a time (recursive, unbatched)."""

    def __init__(self, vocab: int = 20, dim: int = 6, hidden: int = 5, classes: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.leaf = nn.Linear(dim, 3 * hidden)
        self.node = nn.Linear(2 * hidden, 5 * hidden)
        self.out = nn.Linear(hidden, classes)

    def encode(self, tree: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if isinstance(tree, int):
            i, o, u = self.leaf(self.embed(torch.tensor(tree))).chunk(3, dim=-1)
            c = torch.sigmoid(i) * torch.tanh(u)
            h = torch.sigmoid(o) * torch.tanh(c)
            loss = F.cross_entropy(self.out(h), torch.tensor(tree % 3))
            return h, c, loss
        hl, cl, ll = self.encode(tree[0])
        hr, cr, lr = self.encode(tree[1])
        i, fl, fr, o, u = self.node(torch.cat([hl, hr])).chunk(5)
        c = i.sigmoid() * u.tanh() + fl.sigmoid() * cl + torch.sigmoid(fr) * cr
        h = torch.sigmoid(o) * torch.tanh(c)
        return h, c, ll + lr + F.cross_entropy(self.out(h), torch.tensor(1))

    def forward(self, tree: Any) -> tuple[torch.Tensor, torch.Tensor]:
        h, _, loss = self.encode(tree)
        return h, loss


@pytest.mark.parametrize("scheduler", SCHEDULERS)
@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), count=st.integers(1, 6))
def test_tree_lstm_matches_eager(scheduler: Scheduler, seed: int, count: int) -> None:
    rng = random.Random(seed)
    model = TreeLSTM()
    trees = [random_tree(rng, rng.randint(1, 12)) for _ in range(count)]
    assert_matches_eager(model, trees, model, scheduler)


class DagNet(nn.Module):
    """Each DAG node combines the mean of its parents' states; per-node readout summed."""

    def __init__(self, dim: int = 4) -> None:
        super().__init__()
        self.start = nn.Parameter(torch.randn(dim))
        self.mix = nn.Linear(dim, dim)
        self.gate = nn.Linear(2 * dim, dim)

    def forward(self, dag: list[list[int]]) -> torch.Tensor:
        states: list[torch.Tensor] = []
        for parents in dag:
            if not parents:
                states.append(torch.tanh(self.mix(self.start + torch.zeros(4))))
                continue
            mean = torch.stack([states[p] for p in parents]).mean(0)
            first = states[parents[0]]
            gate = torch.sigmoid(self.gate(torch.cat([mean, first])))
            states.append(gate * torch.relu(self.mix(mean)) + (1 - gate) * first)
        return torch.stack(states).sum(0) + states[-1].max() + F.softmax(states[-1], -1)[0]


def random_dag(rng: random.Random, size: int) -> list[list[int]]:
    """Node i's parents are a few earlier nodes (node 0 has none)."""
    return [[] if i == 0 else rng.sample(range(i), rng.randint(1, min(3, i))) for i in range(size)]


@pytest.mark.parametrize("scheduler", SCHEDULERS)
@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), count=st.integers(1, 5))
def test_dag_matches_eager(scheduler: Scheduler, seed: int, count: int) -> None:
    rng = random.Random(seed)
    model = DagNet()
    dags = [random_dag(rng, rng.randint(1, 9)) for _ in range(count)]
    assert_matches_eager(model, dags, model, scheduler)


class SequenceNet(nn.Module):
    """LSTMCell and GRUCell over a sequence, with slicing, splitting and reductions."""

    def __init__(self, vocab: int = 15, dim: int = 6, hidden: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTMCell(dim, hidden)
        self.gru = nn.GRUCell(dim, hidden)
        self.out = nn.Linear(2 * hidden, 3)

    def forward(self, words: list[int]) -> dict[str, torch.Tensor]:
        xs = self.embed(torch.tensor(words))  # [len, dim]
        h = c = torch.zeros(4)
        g = torch.zeros(4)
        outs = []
        for t in range(len(words)):
            h, c = self.lstm(xs[t], (h, c))
            g = self.gru(xs[t], g)
            outs.append(torch.cat([h, g], dim=-1))
        seq = torch.stack(outs)  # [len, 2 * hidden]
        first, second = seq.split(4, dim=1)
        logits = self.out(seq)
        loss = F.cross_entropy(logits, torch.tensor([w % 3 for w in words]))
        return {
            "loss": loss,
            "pooled": seq.max(dim=0).values + seq.mean(0) - torch.cat([first, second], 1).sum(0),
            "probs": F.log_softmax(logits[-1], dim=-1) + second[-1, 1:3].sum(),
            "window": seq[:2].reshape(-1)[:3] * 2.0 + xs.t()[0, 0],
        }


@pytest.mark.parametrize("scheduler", SCHEDULERS)
@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 10_000), count=st.integers(1, 6))
def test_sequences_match_eager(scheduler: Scheduler, seed: int, count: int) -> None:
    rng = random.Random(seed)
    model = SequenceNet()
    seqs = [[rng.randrange(15) for _ in range(rng.randint(2, 7))] for _ in range(count)]
    assert_matches_eager(model, seqs, model, scheduler)


def test_schedulers_agree_on_values() -> None:
    rng = random.Random(3)
    model = TreeLSTM()
    trees = [random_tree(rng, rng.randint(1, 20)) for _ in range(10)]
    agenda = bf.batch_map(model, trees, scheduler="agenda")
    depth = bf.batch_map(model, trees, scheduler="depth")
    for (ha, la), (hd, ld) in zip(agenda, depth, strict=True):
        torch.testing.assert_close(ha, hd, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(la, ld, rtol=1e-12, atol=1e-12)


def test_results_keep_python_values_and_structure() -> None:
    out = bf.batch_map(lambda x: {"n": x, "t": (torch.tensor(float(x)) * 2, None)}, [1, 2])
    assert out[1]["n"] == 2 and out[1]["t"][1] is None
    assert out[1]["t"][0].item() == 4.0


def test_function_wrapper_batches_a_cell_as_one_node() -> None:
    model = TreeLSTM()
    cell = bf.function(lambda a, b: torch.tanh(model.node(torch.cat([a, b], -1))[:5]))
    batched_cell = bf.function(
        lambda a, b: torch.tanh(model.node(torch.cat([a, b], -1))[:, :5]), batched=True
    )

    def encode(tree: Any, f: Any) -> torch.Tensor:
        if isinstance(tree, int):
            return model.embed(torch.tensor(tree))[:5]
        return f(encode(tree[0], f), encode(tree[1], f))

    rng = random.Random(1)
    trees = [random_tree(rng, rng.randint(1, 10)) for _ in range(5)]
    for f in (cell, batched_cell):
        stats = assert_matches_eager(lambda t, f=f: encode(t, f), trees, model)
        internal = sum(_count_internal(t) for t in trees)
        name = "<lambda>"
        assert stats.plan is not None
        assert sum(len(s.nodes) for s in stats.plan.steps if s.sig.name == name) == internal


def _count_internal(tree: Any) -> int:
    return 0 if isinstance(tree, int) else 1 + _count_internal(tree[0]) + _count_internal(tree[1])


def test_in_place_ops_and_item_assignment() -> None:
    def fn(x: float) -> torch.Tensor:
        v = torch.tensor([x, 2 * x, 3.0])
        v.mul_(2)
        v[1] = v[0] + 1
        v += 1
        return v

    assert_matches_eager(fn, [1.0, 2.0, 5.0])


def test_reading_a_value_runs_the_graph_so_far() -> None:
    def fn(x: float) -> torch.Tensor:
        y = torch.tensor(x) * 3
        if y.item() > 4:  # a read: the pending graph runs, then recording goes on
            return y + 1
        return y - 1

    out, stats = bf.batch_map(fn, [1.0, 2.0, 3.0], return_stats=True)
    assert [o.item() for o in out] == [2.0, 7.0, 10.0]
    assert stats.segments >= 2


def test_a_number_made_a_tensor_on_a_named_device_is_on_eagers_device() -> None:
    emb = torch.nn.Embedding(5, 2)
    outs = bf.batch_map(lambda i: emb(torch.tensor(i, device="cpu:0")), [1, 3])
    torch.testing.assert_close(torch.stack(outs), emb(torch.tensor([1, 3])))


def test_keyword_numbers_of_other_types_get_their_own_signatures() -> None:
    # 1, 1.0 and True compare equal; as keyword values they must not share a signature
    def clamp(low: Any) -> torch.Tensor:
        return torch.clamp(torch.tensor([3, 0, -2]), min=low)

    lows = [1, 1.0, 0, 0.5, True]
    outs, stats = bf.batch_map(clamp, lows, return_stats=True)
    for low, out in zip(lows, outs, strict=True):
        want = clamp(low)
        assert out.dtype == want.dtype and torch.equal(out, want)
    assert stats.steps >= 3  # int, float and bool bounds run as separate steps


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_tensors_of_python_numbers_keep_eager_dtypes(scheduler: Scheduler) -> None:
    cases: list[tuple[Any, dict[str, Any]]] = [
        (5, {}),
        (5, {"dtype": torch.float64}),
        (2.5, {}),
        (2.5, {"device": "cpu"}),
        (True, {}),
        (7, {"dtype": torch.int32, "device": torch.device("cpu")}),
        (3, {"requires_grad": False}),
    ]

    def make(case: tuple[Any, dict[str, Any]]) -> torch.Tensor:
        value, kwargs = case
        return torch.tensor(value, **kwargs) * 2

    outs = bf.batch_map(make, cases, scheduler=scheduler)
    for case, out in zip(cases, outs, strict=True):
        want = make(case)
        assert out.dtype == want.dtype and out.device == want.device
        assert torch.equal(out, want)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_embedding_lookups_of_any_index_shape_match_eager(dtype: torch.dtype) -> None:
    # the output shape comes from a rule, not the meta kernel; values and gradients as eager
    torch.manual_seed(0)
    plain = nn.Embedding(20, 4, dtype=torch.float64)
    padded = nn.Embedding(20, 4, padding_idx=0, dtype=torch.float64)
    indices = [5, [1, 0, 7], [[2, 3], [0, 19]], []]

    def lookup(index: Any) -> torch.Tensor:
        i = torch.tensor(index, dtype=dtype)
        return plain(i).sum(-1) + padded(i).sum(-1) + F.embedding(i, plain.weight).sum(-1)

    outs = bf.batch_map(lookup, indices)
    torch.autograd.backward([o.sum() for o in outs])
    tables = (plain.weight, padded.weight)
    batched = [_grad(t).clone() for t in tables]
    plain.zero_grad()
    padded.zero_grad()
    for index, out in zip(indices, outs, strict=True):
        want = lookup(index)
        assert out.shape == want.shape and torch.allclose(out, want)
        want.sum().backward()
    assert all(torch.allclose(b, _grad(t)) for b, t in zip(batched, tables, strict=True))


def _grad(tensor: torch.Tensor) -> torch.Tensor:
    assert tensor.grad is not None
    return tensor.grad


def test_embedding_with_max_norm_is_refused_with_a_clear_error() -> None:
    # max_norm renormalises the table in place on every lookup: no batched form, so a refusal
    table = nn.Embedding(10, 3, max_norm=1.0)
    with pytest.raises(bf.UnsupportedOpError, match="embedding at .*changed in place"):
        bf.batch_map(lambda i: table(torch.tensor(i)), [1, 2])


def test_attributes_of_shared_tensors_read_inside_the_function() -> None:
    # p.device and w.shape are read at once; w.T keeps one identity, so x @ w.T batches
    w = torch.randn(3, 4, dtype=torch.float64)

    def project(x: list[float]) -> torch.Tensor:
        v = torch.tensor(x, dtype=w.dtype, device=w.device)
        assert w.shape == (3, 4) and not w.requires_grad and w.ndim == 2
        return v @ w.T

    xs = [[1.0, 2.0, 3.0, 4.0], [0.5, 0.0, -1.0, 2.0], [3.0, 1.0, 1.0, 1.0]]
    outs, stats = bf.batch_map(project, xs, return_stats=True)
    for x, out in zip(xs, outs, strict=True):  # one matmul of rows, or a vector's: rounding
        torch.testing.assert_close(out, project(x), rtol=1e-13, atol=1e-13)
    assert stats.steps == 2  # the constants, then one matmul for every instance


@pytest.mark.parametrize("direct", [True, False])
def test_factories_on_tensors_that_need_grad_match_eager(
    direct: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torch.as_tensor(x) / torch.tensor(n) on plain arguments are recorded straight as sources
    # (direct) or through the general path; both keep x's history, as eager does, also when a
    # factory runs under no_grad inside the function
    if not direct:
        monkeypatch.setattr(recorder_module, "_FACTORY_ARGS", frozenset())
    torch.manual_seed(0)
    lin = nn.Linear(3, 2).double()
    xs = [torch.randn(n, 3, dtype=torch.float64, requires_grad=True) for n in (1, 4, 2)]

    def loss(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            offset = torch.zeros(2, dtype=torch.float64) + 0.5
        return (lin(torch.as_tensor(x)).tanh() * offset).sum()

    def grads(outs: list[torch.Tensor]) -> list[torch.Tensor]:
        for x in xs:
            x.grad = None
        lin.zero_grad()
        torch.stack(outs).sum().backward()
        assert lin.weight.grad is not None
        return [x.grad for x in xs if x.grad is not None] + [lin.weight.grad.clone()]

    batched = bf.batch_map(loss, xs)
    got = grads(batched)
    eager = [loss(x) for x in xs]
    want = grads(eager)
    torch.testing.assert_close(torch.stack(batched), torch.stack(eager))
    assert len(got) == len(want) == len(xs) + 1
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


def test_results_in_dataclasses_come_back_as_tensors() -> None:
    """A dataclass holding lazy values (which ``tree_map`` does not walk) once came back with
    them, unusable after ``batch_map``; frozen ones included."""

    @dataclasses.dataclass(frozen=True)
    class Output:
        state: torch.Tensor
        parts: list[torch.Tensor]
        count: int

    def fn(x: list[float]) -> Output:
        t = torch.tensor(x)
        return Output(t * 2, [t + 1, t.sum()], len(x))

    inputs = [[1.0, 2.0], [3.0, 4.0]]
    for got, want in zip(bf.batch_map(fn, inputs), map(fn, inputs), strict=True):
        assert type(got) is Output and got.count == want.count
        assert torch.equal(got.state, want.state)
        assert all(torch.equal(a, b) for a, b in zip(got.parts, want.parts, strict=True))


def test_deepcopy_of_a_lazy_value_copies_it_or_refuses_as_eager() -> None:
    """``copy.deepcopy`` of a lazy tensor once failed inside the recorder with an
    ``AttributeError``; it is a recorded clone, and a value that requires grad is refused as
    eagerly (no graph leaf)."""
    weight = torch.randn(2, requires_grad=True)

    def copies(x: list[float]) -> Any:
        t = torch.tensor(x) * 2
        c = copy.deepcopy({"t": t, "n": 1})["t"]
        c.add_(1)  # a copy: t stays
        return t, c

    inputs = [[1.0, 2.0], [3.0, 4.0]]
    for got, want in zip(bf.batch_map(copies, inputs), map(copies, inputs), strict=True):
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    with pytest.raises(RuntimeError, match="graph leaves"):
        bf.batch_map(lambda x: copy.deepcopy(torch.tensor(x) * weight), inputs)


def test_a_shallow_copy_shares_the_value_as_eager() -> None:
    """Eagerly ``copy.copy(t)`` is another tensor on ``t``'s memory: a write into the copy
    changes ``t``; the copied lazy object once got the write alone."""

    def writes(x: list[float]) -> Any:
        t = torch.tensor(x) * 2
        copy.copy(t).add_(1)
        return t

    inputs = [[1.0, 2.0], [3.0, 4.0]]
    for got, want in zip(bf.batch_map(writes, inputs), map(writes, inputs), strict=True):
        assert torch.equal(got, want)
