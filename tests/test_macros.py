"""Cached traces of module calls equal op-by-op recording and eager execution."""

from __future__ import annotations

import collections
import random
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import batchfold as bf
from batchfold.lazy.kept import forget
from batchfold.lazy.ragged_macros import ORIGINAL_CALL
from reference import assert_matches_eager, flat_tensors

SCHEDULERS = ["agenda", "depth"]
pytestmark = pytest.mark.usefixtures("float64")


class Cell(nn.Module):
    """A binary Tree-LSTM cell written for one node."""

    def __init__(self, hidden: int = 5) -> None:
        super().__init__()
        self.mix = nn.Linear(2 * hidden, 5 * hidden)

    def forward(self, hl: Any, cl: Any, hr: Any, cr: Any) -> tuple[Any, Any]:
        i, fl, fr, o, u = self.mix(torch.cat([hl, hr])).chunk(5)
        c = i.sigmoid() * u.tanh() + fl.sigmoid() * cl + fr.sigmoid() * cr
        return o.sigmoid() * c.tanh(), c


class TreeModel(nn.Module):
    """Leaves embedded, nodes combined by a cell module, a loss on every node."""

    def __init__(self, vocab: int = 12, hidden: int = 5) -> None:
        super().__init__()
        self.hidden = hidden
        self.embed = nn.Embedding(vocab, hidden)
        self.cell = Cell(hidden)
        self.head = nn.Linear(hidden, 3)

    def node(self, tree: Any) -> tuple[Any, Any, Any]:
        label = torch.tensor(len(str(tree)) % 3)
        if isinstance(tree, int):
            h = torch.tanh(self.embed(torch.tensor(tree)))
            return h, torch.zeros(self.hidden), F.cross_entropy(self.head(h), label)
        hl, cl, ll = self.node(tree[0])
        hr, cr, lr = self.node(tree[1])
        h, c = self.cell(hl, cl, hr, cr)
        return h, c, F.cross_entropy(self.head(h), label) + ll + lr

    def forward(self, tree: Any) -> tuple[Any, Any]:
        h, _, loss = self.node(tree)
        return h, loss


def random_tree(rng: random.Random, leaves: int) -> Any:
    if leaves == 1:
        return rng.randrange(12)
    k = rng.randint(1, leaves - 1)
    return (random_tree(rng, k), random_tree(rng, leaves - k))


@pytest.mark.parametrize("scheduler", SCHEDULERS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cached_traces_match_eager_and_op_by_op_recording(scheduler: str, seed: int) -> None:
    rng = random.Random(seed)
    model = TreeModel()
    trees = [random_tree(rng, rng.randint(1, 9)) for _ in range(6)]
    stats = assert_matches_eager(model, trees, model, scheduler)  # type: ignore[arg-type]
    assert stats.module_calls_cached > 0
    plain = bf.batch_map(model, trees, scheduler=scheduler, cache_modules=False)  # type: ignore[arg-type]
    cached = bf.batch_map(model, trees, scheduler=scheduler)  # type: ignore[arg-type]
    for a, b in zip(flat_tensors(cached), flat_tensors(plain), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert bf.last_stats().nodes < stats.nodes + 1  # type: ignore[union-attr]


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_cached_traces_on_dags(scheduler: str) -> None:
    mix = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))
    rng = random.Random(3)
    dags = [[sorted(rng.sample(range(i), min(i, 2))) for i in range(rng.randint(2, 8))]]
    dags += [[[], [0], [0, 1], [1, 2], [0, 3]], [[]]]

    def fn(dag: list[list[int]]) -> torch.Tensor:
        states: list[torch.Tensor] = []
        for parents in dag:
            x = torch.ones(4) if not parents else torch.stack([states[p] for p in parents]).sum(0)
            states.append(mix(x))
        return torch.stack(states).sum(0)

    stats = assert_matches_eager(fn, dags, mix, scheduler)  # type: ignore[arg-type]
    assert stats.module_calls_cached > 0


class ValueBranch(nn.Module):
    """Branches on a value it computes: a sync point, so never cached."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x: Any) -> Any:
        y = self.lin(x)
        return y * 2 if y.sum() > 0 else -y


def test_a_module_that_reads_a_value_is_not_cached_and_matches_eager() -> None:
    module = ValueBranch()
    xs = [[1.0, 2.0, 3.0], [-1.0, -2.0, -3.0], [0.5, -0.5, 0.1]] * 2

    def fn(x: list[float]) -> Any:
        t = torch.tensor(x)
        return module(module(t))

    stats = assert_matches_eager(fn, xs, module)  # type: ignore[arg-type]
    assert stats.module_misses["ValueBranch: reads a value (a sync point)"] > 0
    assert stats.module_calls_cached > 0  # its Linear, called in each (uncached) forward


_CALLS = [0]  # state outside the module: no attribute of it changes


class Alternating(nn.Module):
    """Records different ops on alternate calls (its state is outside it): the second trace
    sees it."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x: Any) -> Any:
        _CALLS[0] += 1
        return self.lin(x) * 2 if _CALLS[0] % 2 else self.lin(x)


def test_a_module_whose_ops_change_between_calls_is_not_cached() -> None:
    _CALLS[0] = 0
    module = Alternating()
    outs, stats = bf.batch_map(
        lambda x: module(torch.tensor(x)), [[1.0, 2.0]] * 5, return_stats=True
    )
    assert stats.module_misses == {
        "Alternating: records different ops on calls with the same arguments": 4
    }
    _CALLS[0] = 0
    for out in outs:
        torch.testing.assert_close(out, module(torch.tensor([1.0, 2.0])))


class Noting(nn.Module):
    """Counts its calls and keeps what it saw: Python side effects on every call."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.calls = 0
        self.seen: list[tuple[int, ...]] = []

    def forward(self, x: Any) -> Any:
        self.calls += 1
        self.seen.append(tuple(x.shape))
        return torch.tanh(self.lin(x))

    def count(self) -> int:
        """How many calls it saw."""
        return self.calls


class _State:
    """A plain object a module keeps its counts in."""

    def __init__(self) -> None:
        self.n = 0


class NotingDeeper(Noting):
    """Changes what its containers and objects hold, binding no attribute anew."""

    def __init__(self) -> None:
        super().__init__()
        self.stats, self.ring, self.state = {"n": 0}, collections.deque([0, 0]), _State()

    def forward(self, x: Any) -> Any:
        self.stats["n"] += 1  # a dict's value
        self.ring.append(self.stats["n"])  # a deque kept at its length
        self.ring.popleft()
        self.state.n += 1  # a plain object's attribute
        return torch.tanh(self.lin(x)) * (2.0 if self.state.n > 3 else 1.0)

    def count(self) -> int:
        """How many calls it saw."""
        return self.state.n


@pytest.mark.parametrize("kind", [Noting, NotingDeeper])
@pytest.mark.parametrize("ragged", [True, False])
def test_a_module_that_changes_its_attributes_runs_its_python_on_every_call(
    ragged: bool, kind: type[Noting]
) -> None:
    module, eager_module = kind(), kind()
    eager_module.load_state_dict(module.state_dict())
    items = [torch.randn(n, 2) for n in (1, 3, 3, 2, 3, 1)]
    outs, stats = bf.batch_map(
        lambda x: module(torch.as_tensor(x)), items, ragged=ragged, return_stats=True
    )
    assert module.count() == len(items)
    assert stats.module_calls_cached == 0
    assert all("changes its attribute" in reason for reason in stats.module_misses)
    for out, x in zip(outs, items, strict=True):
        torch.testing.assert_close(out, eager_module(x))
    assert vars(module).keys() == vars(eager_module).keys()


def test_multihead_attention_per_instance_equals_eager() -> None:
    torch.manual_seed(0)
    attention = nn.MultiheadAttention(8, 2).double()
    items = [torch.randn(n, 8, dtype=torch.float64) for n in (4, 4, 2, 1)]
    assert_matches_eager(lambda x: attention(*(torch.as_tensor(x),) * 3)[0], items, attention)


def test_dropout_inside_a_cached_module_draws_per_instance() -> None:
    block = nn.Sequential(nn.Linear(8, 64), nn.Dropout(0.5))
    outs, stats = bf.batch_map(lambda _: block(torch.ones(8)), range(6), return_stats=True)
    assert stats.module_calls_cached == 4
    masks = [o == 0 for o in outs]
    for i, a in enumerate(masks):
        for b in masks[i + 1 :]:
            assert not torch.equal(a, b)


def test_weights_and_train_eval_changes_are_honoured() -> None:
    model = TreeModel()
    trees = [((1, 2), 3), (4, (5, 6)), 7]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(2):  # a step changes the weights in place between batch_map calls
        assert_matches_eager(model, trees, model)  # type: ignore[arg-type]
        loss = sum(loss for _, loss in bf.batch_map(model, trees))  # type: ignore[arg-type]
        optimizer.zero_grad()
        loss.backward()  # type: ignore[union-attr]
        optimizer.step()
    head = nn.Sequential(nn.Linear(3, 16), nn.Dropout(0.9))

    def toggled(x: list[float]) -> Any:
        head.train(x[0] > 0)  # train or eval, per instance, before the call
        return head(torch.tensor(x))

    xs = [[-1.0, 2.0, 3.0]] * 3 + [[1.0, 2.0, 3.0]] * 3
    outs = bf.batch_map(toggled, xs)
    head.eval()
    for out in outs[:3]:
        torch.testing.assert_close(out, head(torch.tensor(xs[0])))
    assert all((out == 0).any() for out in outs[3:])  # dropout ran in train mode


def test_a_later_batch_map_reuses_a_confirmed_call_while_the_module_is_unchanged() -> None:
    forget()
    model = TreeModel()
    trees = [((1, 2), 3), (4, (5, 6)), ((7, 8), (9, 10))]
    first = assert_matches_eager(model, trees, model)  # type: ignore[arg-type]
    again = assert_matches_eager(model, trees, model)  # type: ignore[arg-type]
    # the cell (several ops) is not traced again; one-op calls are (a trace of one op is cheap)
    assert first.module_calls_traced - again.module_calls_traced == 2
    with torch.no_grad():
        model.cell.mix.weight.mul_(-1.5)  # in place: still reused, with the new values
    assert (
        assert_matches_eager(model, trees, model).module_calls_traced == again.module_calls_traced
    )  # type: ignore[arg-type]
    model.cell.mix.weight = nn.Parameter(torch.randn(25, 10))  # another tensor: traced again
    assert (
        assert_matches_eager(model, trees, model).module_calls_traced == first.module_calls_traced
    )  # type: ignore[arg-type]
    model.cell.register_forward_pre_hook(lambda *_: None)  # hooks: op by op, run on each call
    hooked = assert_matches_eager(model, trees, model)  # type: ignore[arg-type]
    assert "Cell: it or a submodule has hooks" in hooked.module_misses


@pytest.mark.parametrize("sequences", [False, True])
def test_a_call_that_draws_random_numbers_draws_the_same_in_every_batch_map(
    sequences: bool,
) -> None:
    forget()
    head = nn.Sequential(nn.Linear(4, 6), nn.Dropout(0.5), nn.Linear(6, 2))
    rng = random.Random(0)
    shape = (lambda: (rng.randint(1, 5), 4)) if sequences else (lambda: (4,))
    xs = [torch.randn(*shape()) for _ in range(8)]
    fn = lambda x: head(torch.as_tensor(x))  # noqa: E731
    runs, traced, cached = [], set(), set()
    for _ in range(3):  # the first batch_map of the process confirms, later ones must draw alike
        torch.manual_seed(7)
        out, stats = bf.batch_map(fn, xs, return_stats=True)
        traced.add(stats.module_calls_traced)
        cached.add(stats.module_calls_cached)
        runs.append(out)
    assert len(traced) == 1 and traced.pop() >= 2  # traced as often in every batch_map
    assert min(cached) > 0  # confirmed: reuse was possible
    for out in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], out, strict=True))


def test_a_kept_call_follows_grad_mode_and_dtype() -> None:
    forget()
    model = TreeModel()
    trees = [((1, 2), 3), (4, (5, 6)), ((7, 8), (9, 10))]
    first = assert_matches_eager(model, trees, model)  # type: ignore[arg-type]
    with torch.no_grad():  # another grad mode: another key, traced, no history
        outs = bf.batch_map(model, trees)  # type: ignore[arg-type]
        want = [model(t) for t in trees]
    for got, eager in zip(flat_tensors(outs), flat_tensors(want), strict=True):
        assert not got.requires_grad
        torch.testing.assert_close(got, eager, rtol=1e-10, atol=1e-10)
    again = assert_matches_eager(model, trees, model)  # type: ignore[arg-type]
    assert again.module_calls_traced < first.module_calls_traced  # kept under grad
    head = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))
    weight: torch.Tensor = head[0].weight  # type: ignore[assignment]
    fn = lambda x: head(torch.tensor(x, dtype=weight.dtype))  # noqa: E731
    xs = [[float(i), 1.0, -2.0, 0.5] for i in range(5)]
    assert_matches_eager(fn, xs, head)
    assert assert_matches_eager(fn, xs, head).module_calls_traced == 0  # kept
    head.float()  # the same parameter objects, another dtype: traced again
    assert weight.dtype == torch.float32
    assert assert_matches_eager(fn, xs, head, rtol=1e-5).module_calls_traced == 2


class Scaled(nn.Module):
    """Several ops, reading a buffer's value into Python and calling a function attribute."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.register_buffer("scale", torch.tensor(2.0))
        self.act: Any = torch.tanh
        self.config: Any = None

    def forward(self, x: Any, cfg: Any = None) -> Any:
        y = self.act(self.lin(x)) * float(self.scale)  # type: ignore[arg-type]
        return y * cfg.factor if cfg is not None else y + 1


class Factor:
    """A mutable argument: keyed by identity, so never kept."""

    def __init__(self, factor: float) -> None:
        self.factor = factor


def test_what_a_kept_call_depends_on_is_checked_in_each_batch_map() -> None:
    forget()
    model = Scaled()
    xs = [[float(i), 1.0, -1.0, 0.5] for i in range(6)]
    plain = lambda x: model(torch.tensor(x))  # noqa: E731
    with_cfg = Factor(3.0)
    configured = lambda x: model(torch.tensor(x), with_cfg)  # noqa: E731

    def run(fn: Any) -> bf.Stats:
        stats = assert_matches_eager(fn, xs, model)
        assert stats.module_calls_cached > 0  # confirmed: reuse was possible
        return stats

    run(plain)
    with torch.no_grad():
        model.get_buffer("scale").fill_(5.0)  # read by float(): never kept, traced again
    assert run(plain).module_calls_traced == 2
    del model.scale
    model.scale = 7.0  # type: ignore[assignment]  # a plain attribute: kept while unchanged
    run(plain)
    assert run(plain).module_calls_traced == 0
    model.act = torch.sigmoid  # a function attribute: by identity
    assert run(plain).module_calls_traced == 2
    run(configured)
    with_cfg.factor = -2.0  # an object argument may change: traced in each batch_map
    assert run(configured).module_calls_traced == 2
    model.config = Factor(1.0)  # an attribute of a kind not compared: never kept
    run(plain)
    assert run(plain).module_calls_traced == 2


def test_switching_caching_off() -> None:
    model = TreeModel()
    trees = [((1, 2), 3), (4, (5, 6))] * 3
    _, off = bf.batch_map(model, trees, return_stats=True, cache_modules=False)  # type: ignore[arg-type]
    assert off.module_calls_cached == 0 and off.module_calls_traced == 0
    bf.no_cache(model.cell)
    _, on = bf.batch_map(model, trees, return_stats=True)  # type: ignore[arg-type]
    assert on.module_misses.get("Cell: switched off with no_cache (it, or a submodule)", 0) > 0
    assert on.module_calls_cached > 0  # the other modules still are
    assert "cached traces" in str(on) and "switched off" in str(on)


def test_modules_returning_their_input_or_a_view_of_it() -> None:
    class Same(nn.Module):
        def forward(self, x: Any) -> Any:
            return x

    class Rows(nn.Module):
        def forward(self, x: Any) -> Any:
            return x.view(2, 2)

    same, rows = Same(), Rows()

    def fn(x: list[float]) -> Any:
        t = torch.tensor(x)
        u = same(t)
        v = rows(t)
        t += 1  # eagerly u is t and v views it; here the write is refused where it must be
        return u, v

    with pytest.raises(bf.UnsupportedOpError, match="view of it"):
        bf.batch_map(fn, [[1.0, 2.0, 3.0, 4.0]] * 3)

    def fn2(x: list[float]) -> Any:
        t = torch.tensor(x)
        return same(t) * 2, rows(t) + 1

    stats = assert_matches_eager(fn2, [[1.0, 2.0, 3.0, 4.0]] * 3)  # type: ignore[arg-type]
    assert stats.module_misses == {"Rows: returns a view of an argument": 3}
    assert stats.module_calls_cached == 1  # Same, as no node at all: it hands back its input

    def aliased(x: list[float]) -> Any:
        t = torch.tensor(x)
        u = same(t)  # the same object as t, cached or not
        t += 1
        return u

    assert_matches_eager(aliased, [[1.0, 2.0, 3.0, 4.0]] * 4)  # type: ignore[arg-type]


class Carry(nn.Module):
    """Returns computed values with some of its arguments, as they are, in between."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4).double()

    def forward(self, h: Any, x: Any, *, state: Any) -> Any:
        new = torch.tanh(self.lin(h) + x)
        return new, x, (state, new * 2)


def test_modules_returning_some_arguments_beside_new_values_are_cached() -> None:
    carry = Carry()

    def fn(item: tuple[list[float], int]) -> Any:
        x = torch.tensor(item[0], dtype=torch.float64)
        h, state = x * 0.5, x + 1  # three objects: the first call's arguments are not aliased
        outs, kept = [], state
        for _ in range(item[1]):
            h, same, (kept, doubled) = carry(h, x, state=state)
            assert same is x and kept is state  # the same objects, as eagerly
            outs.append(doubled)
        state += 1  # in place on a handed-back argument: seen through what the call returned
        return outs, kept, state

    rng = random.Random(0)
    items = [([rng.uniform(-1, 1) for _ in range(4)], rng.randint(2, 4)) for _ in range(6)]
    for scheduler in ("agenda", "depth"):
        forget()
        stats = assert_matches_eager(fn, items, carry, scheduler)
        assert stats.module_misses == {}
        # two traced calls confirm the template; every later call is one node
        assert stats.module_calls_traced == 2
        assert stats.module_calls_cached == sum(n for _, n in items) - 2
        again = assert_matches_eager(fn, items, carry, scheduler)  # the template kept
        assert again.module_calls_traced == 0 and again.module_misses == {}

    class Rows(nn.Module):
        def forward(self, x: Any) -> Any:
            return carry.lin(x), x

    rows = Rows()
    lengths = [3, 1, 4, 0, 2]
    seqs = [torch.randn(n, 4, dtype=torch.float64) for n in lengths]

    def on_rows(x: torch.Tensor) -> Any:
        y, same = rows(torch.as_tensor(x))
        return y.sum(0), same is not None

    ragged = assert_matches_eager(on_rows, seqs, carry)
    assert "Rows: returns one of its arguments (a call on sequences)" in ragged.module_misses


def test_a_value_a_cached_call_returns_twice_is_one_object_as_eager() -> None:
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(3, 3).double()

        def forward(self, a: Any) -> Any:
            t = torch.tanh(self.lin(a))
            return t, (t * 2, t)

    twice = Twice()

    def fn(x: torch.Tensor) -> list[torch.Tensor]:
        a, outs = torch.as_tensor(x) * 1, []
        with torch.no_grad():
            for _ in range(3):
                p, (_, q) = twice(a)
                assert p is q
                p.mul_(3)  # eagerly q is p: written too
                outs += [p, q]
                a = q
        return outs

    forget()
    stats = assert_matches_eager(fn, [torch.randn(3, dtype=torch.float64) for _ in range(4)])
    assert stats.module_calls_cached > 0 and not stats.module_misses
    rows = [torch.randn(n, 3, dtype=torch.float64) for n in (2, 5, 1, 3)]  # a ragged macro
    stats = assert_matches_eager(fn, rows)
    assert stats.module_calls_cached > 0 and not stats.module_misses


def test_a_module_returning_only_arguments_after_recording_ops_is_not_cached() -> None:
    class Wasteful(nn.Module):
        def forward(self, x: Any) -> Any:
            _ = x * 2
            return x

    wasteful = Wasteful()
    stats = assert_matches_eager(lambda v: wasteful(torch.tensor(v)) + 1, [[1.0, 2.0]] * 3)
    assert list(stats.module_misses) == [
        "Wasteful: returns only its arguments, after recording ops it does not return"
    ]


def test_identity_hands_back_its_input_and_its_hooks_still_run() -> None:
    identity = nn.Identity()
    lin = nn.Linear(3, 3).double()

    def fn(x: torch.Tensor) -> Any:
        h = identity(lin(torch.as_tensor(x)))
        return identity(h) * 2, identity(input=h) + 1  # by keyword: PyTorch's way

    items = [torch.randn(3, dtype=torch.float64) for _ in range(4)]
    assert_matches_eager(fn, items)
    with pytest.raises(TypeError, match="positional arguments"):  # as eagerly
        bf.batch_map(lambda x: identity(torch.as_tensor(x), 1), items)
    seen: list[tuple[int, ...]] = []
    handle = identity.register_forward_hook(lambda m, args, out: seen.append(tuple(out.shape)))
    try:
        assert_matches_eager(lambda x: identity(lin(torch.as_tensor(x))) * 3, items)
    finally:
        handle.remove()
    assert seen and all(shape == (3,) for shape in seen)


def test_a_submodule_switched_to_eval_alone_is_honoured() -> None:
    model = nn.Sequential(nn.Linear(3, 16), nn.Dropout(0.9)).train()
    xs = [[1.0, 2.0, 3.0]] * 4
    fn = lambda x: model(torch.tensor(x))  # noqa: E731
    bf.batch_map(fn, xs)  # traced with the dropout on
    bf.batch_map(fn, xs)
    model[1].eval()  # the submodule only; the call's own module still trains
    for out in bf.batch_map(fn, xs):
        torch.testing.assert_close(out, model[0](torch.tensor(xs[0])))


class Holding(nn.Module):
    """Holds Python data its forward only reads: a long list, a dict, a plain object."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.table, self.names, self.state = list(range(300)), {"a": 1.5}, _State()

    def forward(self, x: Any) -> Any:
        return self.lin(x) * self.names["a"] + self.table[299] + self.state.n


def test_a_module_that_only_reads_its_python_data_is_cached() -> None:
    module = Holding()
    items = [torch.randn(2) for _ in range(6)]
    outs, stats = bf.batch_map(lambda x: module(torch.as_tensor(x)), items, return_stats=True)
    assert stats.module_calls_cached == 4 and not stats.module_misses
    for out, x in zip(outs, items, strict=True):
        torch.testing.assert_close(out, module(x))


# dynamo reads .grad of the tensors it traces; its warning is PyTorch's business, not this test's
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
def test_compiled_modules_and_functions_record_their_eager_code() -> None:
    from torch._dynamo import eval_frame

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.Tanh()).double()
    model.compile(backend="eager")  # dynamo in front, no code generation behind it
    scale = torch.compile(lambda h: torch.relu(h) * 2, backend="eager")
    xs = [torch.randn(4, dtype=torch.float64) for _ in range(5)]
    assert_matches_eager(lambda x: scale(model(torch.as_tensor(x))), xs, model)
    assert eval_frame._stance.stance == "default"  # compiled code compiles again after it


def test_batch_map_called_from_compiled_code_runs_and_puts_pytorch_back() -> None:
    from torch._dynamo import eval_frame

    from batchfold.lazy import dispatch, hooks

    torch.manual_seed(0)
    lin = nn.Linear(3, 2).double()
    xs = [torch.randn(3, dtype=torch.float64) for _ in range(3)]

    @torch.compile(backend="eager")
    def step(batch: list[torch.Tensor]) -> list[Any]:
        return bf.batch_map(lambda x: torch.tanh(lin(torch.as_tensor(x))).sum(), batch)

    got = step(xs)
    want = [torch.tanh(lin(x)).sum() for x in xs]
    assert all(torch.allclose(g, w, rtol=1e-12) for g, w in zip(got, want, strict=True))
    assert all(g.requires_grad for g in got)
    assert hooks._INSTALLED[0] == 0 and nn.Module._call_impl is ORIGINAL_CALL
    assert torch.tensor is dispatch.ORIGINAL_TENSOR and eval_frame._stance.stance == "default"


class _Identity(nn.Module):
    """``l(q) - l(k)``, or ``l(q)`` where ``q is k`` (the fast path of self-attention)."""

    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(2, 2).double()

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return self.l(q) if q is k else self.l(q) - self.l(k)


@pytest.mark.parametrize("rows", [False, True])
def test_a_call_taking_one_value_twice_is_keyed_apart(rows: bool) -> None:
    # m(h, h) took the template of m(h, g): the forward's q is k went the other way
    forget()
    model = _Identity()

    def fn(item: tuple[torch.Tensor, bool]) -> torch.Tensor:
        h = torch.as_tensor(item[0])
        return model(h, h if item[1] else h * 2)

    shape = (3, 2) if rows else (2,)
    items = [(torch.ones(*shape, dtype=torch.float64) * i, i == 3) for i in range(1, 5)]
    if rows:
        items[1] = (torch.ones(5, 2, dtype=torch.float64), False)  # another length
    assert_matches_eager(fn, items, model)


def test_no_cache_on_a_submodule_keeps_its_parents_calls_op_by_op() -> None:
    # the parent (nn.Sequential) was cached and replayed the child's first trace
    scale = [1.0]

    class Scale(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x / scale[0]  # a global the function changes per instance

    model = nn.Sequential(nn.Linear(2, 2).double(), bf.no_cache(Scale()))

    def fn(item: tuple[torch.Tensor, float]) -> torch.Tensor:
        scale[0] = item[1]
        return model(torch.as_tensor(item[0]))

    items = [(torch.ones(2, dtype=torch.float64), t) for t in (1.0, 1.0, 2.0, 4.0)]
    assert_matches_eager(fn, items, model)


@pytest.mark.parametrize("change", ["ModuleList.insert", "Sequential.insert", "ModuleDict.clear"])
def test_a_container_changed_inside_a_batch_map_is_seen_by_later_calls(change: str) -> None:
    # these write into _modules without __setattr__: later calls replayed the old layers
    first, extra = nn.Linear(2, 2).double(), nn.Linear(2, 2).double()

    class Stack(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList([first])
            self.seq = nn.Sequential(nn.Identity())
            self.named = nn.ModuleDict({"extra": extra})

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in [*self.layers, *self.seq, *self.named.values()]:
                x = layer(x)
            return x

    def run(batched: bool) -> list[torch.Tensor]:
        model = Stack()

        def fn(i: int) -> torch.Tensor:
            if i == 2 and change == "ModuleList.insert":
                model.layers.insert(0, extra)
            elif i == 2 and change == "Sequential.insert":
                model.seq.insert(0, extra)
            elif i == 2:
                model.named.clear()
            return model(torch.ones(2, dtype=torch.float64))

        return list(bf.batch_map(fn, range(4))) if batched else [fn(i) for i in range(4)]

    for got, want in zip(run(True), run(False), strict=True):
        torch.testing.assert_close(got, want)


class _Appends(nn.Module):
    """Appends what it computes to a list it is given, and, when asked, to its own."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2).double()
        self.acts: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor, cache: list[torch.Tensor]) -> torch.Tensor:
        h = torch.tanh(self.lin(x))
        cache.append(h)
        if _COLLECT[0]:
            self.acts.append(h)
        return h


_COLLECT = [False]


def test_a_module_that_changes_a_list_it_is_given_or_holds_runs_its_python() -> None:
    # a list argument changed by the call: a cached call skipped the append (and a changed
    # count of lazy values crashed the scheduler); a list attribute appended to only from the
    # second batch_map on got the dry trace's stand-in value, unusable
    forget()
    module = _Appends()

    def fn(x: torch.Tensor) -> Any:
        cache: list[torch.Tensor] = []
        module.acts.clear()
        return module(torch.as_tensor(x), cache), cache, list(module.acts)

    items = [torch.ones(2, dtype=torch.float64) * i for i in range(4)]
    for collect in (False, True):  # the second batch_map dry-traces the kept call
        _COLLECT[0] = collect
        for got, x in zip(bf.batch_map(fn, items), items, strict=True):
            want = fn(x)
            assert len(got[1]) == len(want[1]) == 1 and len(got[2]) == len(want[2])
            for g, w in zip(flat_tensors(got), flat_tensors(want), strict=True):
                torch.testing.assert_close(g, w)
    _COLLECT[0] = False


class _Table(nn.Module):
    """Keeps a table it makes on its first call (a positional encoding's)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4).double()
        self.table: Any = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.table is None:
            self.table = torch.arange(16.0, dtype=torch.float64)[:, None].expand(16, 4) * 0.1
        return self.lin(x) + self.table[: x.shape[0]]


def test_a_module_attribute_set_to_a_value_made_inside_holds_its_value_after() -> None:
    # it held the lazy value: the next batch_map, and eager calls, raised LazyValueError
    module, eager = _Table(), _Table()
    eager.load_state_dict(module.state_dict())
    items = [torch.randn(n, 4, dtype=torch.float64) for n in (3, 5, 2)]
    for _ in range(2):
        for got, x in zip(
            bf.batch_map(lambda x: module(torch.as_tensor(x)), items), items, strict=True
        ):
            torch.testing.assert_close(got, eager(x))
    assert type(module.table) is torch.Tensor
    torch.testing.assert_close(module.table, eager.table)
    torch.testing.assert_close(module(items[0]), eager(items[0]))
