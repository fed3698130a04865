"""Module calls on ragged inputs, cached once for every length, equal eager execution.

Values and gradients in float64 against the same module called one instance at a time, both
schedulers; calls whose ops depend on the length are recorded op by op and still equal eager.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import batchfold as bf
from batchfold.lazy.kept import forget
from batchfold.models.attention import AttentionClassifier
from batchfold.schedule import Scheduler
from fast_path import count_fast_path, no_fast_path, plan_steps

LENGTHS = [3, 1, 5, 3, 2, 7, 1, 4, 6, 2]


def _sequences(dim: int = 4, seed: int = 0, lengths: list[int] = LENGTHS) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(n, dim, dtype=torch.float64, generator=gen) for n in lengths]


def _check(module: nn.Module, fn, xs, scheduler: Scheduler = "depth") -> bf.Stats:  # noqa: ANN001
    got, stats = bf.batch_map(fn, xs, scheduler=scheduler, return_stats=True)
    want = [fn(x) for x in xs]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    params = list(module.parameters())
    grads = torch.autograd.grad(_weighted(got), params, allow_unused=True)
    wants = torch.autograd.grad(_weighted(want), params, allow_unused=True)
    for g, w in zip(grads, wants, strict=True):
        assert (g is None) == (w is None)
        if g is not None:
            torch.testing.assert_close(g, w)
    return stats


def _weighted(outputs: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack([(i + 1) * o.sum() for i, o in enumerate(outputs)]).sum()


def _nodes(stats: bf.Stats, name: str) -> int:
    assert stats.plan is not None
    return sum(len(s.nodes) for s in stats.plan.steps if s.sig.name == name)


class Encoder(nn.Module):
    """Row-wise layers, a softmax over the rows, a weighted sum, an LSTM: [L, 4] -> [L, 3], [3]."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 6)
        self.norm = nn.LayerNorm(6)
        self.lstm = nn.LSTM(6, 3)
        self.score = nn.Linear(3, 1)

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if h.dim() != 2 or h.shape[0] < 1 or h.shape[1] != 4:  # a guard, not a use
            raise ValueError("one sequence [L >= 1, 4]")
        states, (last, _) = self.lstm(torch.relu(self.norm(self.inp(h))))
        weights = torch.softmax(self.score(states).squeeze(-1), 0)
        return states * 2, weights @ states + last[0]


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_a_module_on_sequences_is_one_node_per_call_for_every_length(scheduler: Scheduler) -> None:
    model = Encoder().double()

    def fn(x: torch.Tensor) -> torch.Tensor:
        states, context = model(torch.as_tensor(x))
        return states.sum(0) * context

    stats = _check(model, fn, _sequences(), scheduler)
    assert stats.module_calls_cached == len(LENGTHS) - 2  # two traces of two lengths confirm
    assert not stats.module_misses and stats.plan is not None
    calls = [s for s in stats.plan.steps if s.sig.name == "Encoder"]
    assert len(calls) == 1 and len(calls[0].nodes) == len(LENGTHS) - 2  # all lengths, one step


def test_calls_of_one_length_are_cached_by_shape_until_another_length_comes() -> None:
    model = Encoder().double()
    fn = lambda x: model(torch.as_tensor(x))[1]  # noqa: E731
    stats = _check(model, fn, _sequences(lengths=[3, 3, 3, 3, 3, 5, 2, 4]))
    # 3: traced for every length, then twice by its shape, then cached by shape (2 calls);
    # 5 confirms the cache for every length: 2 and 4 are cached calls of it
    assert stats.module_calls_cached == 4 and _nodes(stats, "Encoder") == 4


def test_the_attention_classifier_is_cached_and_equals_eager() -> None:
    torch.manual_seed(0)
    model = AttentionClassifier(in_dim=4, dim=5, hidden=3, n_outputs=2).double()
    xs = _sequences()
    labels = [i % 2 for i in range(len(xs))]

    def loss(item: tuple[torch.Tensor, int]) -> torch.Tensor:
        return F.cross_entropy(model(torch.as_tensor(item[0])), torch.tensor(item[1]))

    stats = _check(model, loss, list(zip(xs, labels, strict=True)))
    assert stats.module_calls_cached >= len(xs) - 2


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
@pytest.mark.parametrize("lengths", [[*LENGTHS, 9, 2, 4], [5] * 8], ids=["several", "one"])
@pytest.mark.parametrize("graphs", [False, True], ids=["sequences", "graphs"])
def test_the_fast_path_of_ragged_calls_makes_the_plan_of_the_slow_one(
    scheduler: Scheduler, lengths: list[int], graphs: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    forget()
    if graphs:  # x [L, 8] and its adjacency [L, L], some of them [8, 8] both
        model: nn.Module = MessagePassing().double()
        name = "MessagePassing"
        gen = torch.Generator().manual_seed(12)
        xs: list[Any] = [
            (x, (torch.rand(len(x), len(x), dtype=torch.float64, generator=gen) > 0.5).double())
            for x in _sequences(dim=8, seed=12, lengths=[*lengths, 8, 8])
        ]

        def fn(g: Any) -> torch.Tensor:
            return model(torch.as_tensor(g[0]), torch.as_tensor(g[1]))

    else:
        model, name = Encoder().double(), "Encoder"
        xs = _sequences(seed=11, lengths=lengths)

        def fn(g: Any) -> torch.Tensor:
            rows, pooled = model(torch.as_tensor(g))
            return rows.sum(0) + pooled

    taken = count_fast_path(monkeypatch)
    with_fast = _check(model, fn, xs, scheduler)
    assert any(taken)
    forget()
    no_fast_path(monkeypatch)
    slow = _check(model, fn, xs, scheduler)
    assert plan_steps(with_fast) == plan_steps(slow) and _nodes(slow, name) > 0
    assert with_fast.module_calls_cached == slow.module_calls_cached


class Branches(nn.Module):
    """Takes another path for long sequences: cached calls must not take the wrong one."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 2), nn.Linear(4, 2)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return (self.a(h) if h.shape[0] > 4 else self.b(h)).sum(0)


def test_a_branch_on_the_length_is_guarded() -> None:
    model = Branches().double()
    stats = _check(model, lambda x: model(torch.as_tensor(x)), _sequences())
    # lengths 3 and 1 traced the short branch; calls of length > 4 fail the guard
    assert _nodes(stats, "Branches") == sum(1 for n in LENGTHS[2:] if n <= 4)
    assert any("comparison on the length" in m for m in stats.module_misses)


class Mean(nn.Module):
    """Divides by the length read from the shape: a use of the length, never cached."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.lin(h).sum(0) / h.shape[0] + len(h) * 0.5


def test_arithmetic_on_the_length_is_not_cached() -> None:
    model = Mean().double()
    stats = _check(model, lambda x: model(torch.as_tensor(x)), _sequences())
    assert _nodes(stats, "Mean") == 0  # its linear layer is cached: a call of its own
    assert any("uses the length of a ragged input" in m for m in stats.module_misses)


class TypeChecks(nn.Module):
    """Reads its input's length and shape as eager code may: their types, text, int methods."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        n, shape = h.shape[0], h.shape
        scale = n if isinstance(n, int) and isinstance(shape, torch.Size) else -1
        return self.lin(h).sum(0) * scale + len(str(shape)) + n.bit_length() + n.real


def test_a_traced_calls_length_and_shape_pass_for_an_int_and_a_size() -> None:
    # in a traced call they were a stand-in and a tuple: isinstance said no, str(shape) was
    # "(2, 4)", and the call was cached with the other branch (a silently different number)
    forget()
    model = TypeChecks().double()
    stats = _check(model, lambda x: model(torch.as_tensor(x)), _sequences())
    assert any("uses the length of a ragged input" in m for m in stats.module_misses)


def test_a_length_handed_where_a_plain_int_is_needed_says_how_to_write_it() -> None:
    class Positions(nn.Module):
        def forward(self, h: torch.Tensor) -> torch.Tensor:
            return torch.as_tensor(np.arange(h.shape[0]), dtype=h.dtype) @ h

    model = Positions()
    with pytest.raises(TypeError) as caught:
        bf.batch_map(lambda x: model(torch.as_tensor(x)), _sequences())
    assert any("write int(x.shape[0])" in note for note in getattr(caught.value, "__notes__", ()))


class WithLength(nn.Module):
    """Returns its input's length and shape beside a tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, int, torch.Size, list[int]]:
        return self.lin(h), h.shape[0], h.shape, [len(h)]


def test_a_length_returned_by_a_traced_call_is_an_int_as_eagerly() -> None:
    """The traced call handed back its internal length object (``isinstance(n, int)`` false,
    not JSON-serialisable) and a tuple for ``h.shape``; results kept ``torch.Size`` as a
    tuple."""
    model = WithLength().double()
    xs = _sequences()
    got = bf.batch_map(lambda x: model(torch.as_tensor(x)), xs)
    for (_, n, shape, ns), x in zip(got, xs, strict=True):
        assert type(n) is int and n == len(x) and ns == [len(x)] and type(ns[0]) is int
        assert type(shape) is torch.Size and shape == (len(x), 4)


class RunningSum(nn.Module):
    """Running sums over the rows: an op with no ragged rule for its input."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.lin(h).cumsum(0) * 2


def test_an_op_without_a_ragged_rule_is_not_cached() -> None:
    model = RunningSum().double()
    stats = _check(model, lambda x: model(torch.as_tensor(x)), _sequences())
    assert _nodes(stats, "RunningSum") == 0
    assert any("no ragged rule" in m for m in stats.module_misses)


def test_dropout_inside_a_cached_call_draws_per_instance() -> None:
    model = nn.Sequential(nn.Linear(4, 40), nn.Dropout(0.5)).double().train()
    xs = [torch.ones(n, 4, dtype=torch.float64) for n in (2, 3, 3, 3, 3)]
    got, stats = bf.batch_map(lambda x: model(torch.as_tensor(x)), xs, return_stats=True)
    assert stats.module_calls_cached == 3
    zeros = [(g == 0) for g in got[2:]]
    assert not torch.equal(zeros[0], zeros[1]) and not torch.equal(zeros[1], zeros[2])
    for g, x in zip(got, xs, strict=True):
        kept = g != 0  # kept entries are the linear layer's, scaled by 1 / (1 - p)
        torch.testing.assert_close(g[kept], (model[0](x) * 2)[kept])


def test_weights_and_train_mode_changed_between_calls_are_honoured() -> None:
    model = Encoder().double()
    fn = lambda x: model(torch.as_tensor(x))[1]  # noqa: E731
    xs = _sequences(seed=3)
    bf.batch_map(fn, xs)
    with torch.no_grad():
        model.inp.weight.mul_(-0.5)
    _check(model, fn, xs)
    model.eval()
    _check(model, fn, xs)


def test_ragged_off_keeps_modules_on_sequences_keyed_by_exact_shape() -> None:
    model = Encoder().double()
    rng = random.Random(0)
    lengths = [rng.choice([2, 3]) for _ in range(12)]
    fn = lambda x: model(torch.as_tensor(x))[1]  # noqa: E731
    xs = _sequences(lengths=lengths)
    got, stats = bf.batch_map(fn, xs, ragged=False, return_stats=True)
    for g, x in zip(got, xs, strict=True):
        torch.testing.assert_close(g, fn(x))
    assert stats.ragged_steps == 0 and stats.module_calls_cached == len(xs) - 4


class Switch(nn.Module):
    """Its ops depend on a Python attribute the cache key does not hold."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)
        self.double_it = False

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        out = self.lin(h)
        return (out * 2 if self.double_it else out).sum(0)


def test_a_later_batch_map_reuses_the_confirmed_trace_while_the_module_is_unchanged() -> None:
    forget()
    model = Switch().double()
    fn = lambda x: model(torch.as_tensor(x))  # noqa: E731
    xs = _sequences(seed=4)
    first = _check(model, fn, xs)
    again = _check(model, fn, xs)
    assert first.module_calls_traced == 2 and again.module_calls_traced == 0
    assert again.steps < first.steps  # no call op by op: one step of the macro, one source
    model.double_it = True  # a plain attribute changed: traced twice again, eager's values
    changed = _check(model, fn, xs)
    assert changed.module_calls_traced == 2
    with torch.no_grad():
        model.lin.weight.mul_(-2.0)  # in place (an optimizer step): reused, the new values
    assert _check(model, fn, xs).module_calls_traced == 0
    model.lin.weight = nn.Parameter(torch.randn(2, 4, dtype=torch.float64))  # a new tensor
    assert _check(model, fn, xs).module_calls_traced == 2
    model.lin.register_forward_hook(lambda *_: None)  # hooks: op by op, as eager
    assert _check(model, fn, xs).module_calls_cached == 0


def test_a_kept_call_of_rows_takes_a_first_call_as_long_as_it_is_wide() -> None:
    # [4, 4] alone is ambiguous (rows, or an adjacency); kept as rows, the next batch_map
    # reads it as rows, so that no call is traced op by op (it was, once per batch_map)
    forget()
    model = AttentionClassifier(4, 6, 5, 3).double()
    fn = lambda x: model(torch.as_tensor(x))  # noqa: E731
    _check(model, fn, _sequences(seed=5))
    square_first = _check(model, fn, _sequences(seed=6, lengths=[4, 2, 7, 4, 1]))
    assert square_first.module_calls_traced == 0 and square_first.module_calls_cached == 5
    assert square_first.steps == 2  # the sources and one macro step


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_a_recurrent_layer_on_a_sequence_of_no_rows_raises_eagers_error(
    scheduler: Scheduler,
) -> None:
    # packed with the others (agenda), it failed on a shape deep inside the packed call
    gru = nn.GRU(6, 4).double()
    xs = _sequences(dim=6, lengths=[3, 0, 5])
    with pytest.raises(RuntimeError, match="Expected sequence length to be larger than 0"):
        gru(xs[1])
    with pytest.raises(RuntimeError, match="Expected sequence length to be larger than 0"):
        bf.batch_map(lambda x: gru(torch.as_tensor(x))[0], xs, scheduler=scheduler)


def test_a_module_with_an_lstm_is_reused_by_a_later_batch_map() -> None:
    forget()
    model = Encoder().double()  # nn.LSTM remakes its weak references to its weights per call
    fn = lambda x: model(torch.as_tensor(x))[1]  # noqa: E731
    xs = _sequences(seed=8)
    assert _check(model, fn, xs).module_calls_traced == 2
    assert _check(model, fn, xs).module_calls_traced == 0


class Transposed(nn.Module):
    """Reads ``W.t()``, made once from a parameter: a tensor a kept trace must not hold."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3, 4))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return (h @ self.weight.t()).sum(0)


def test_a_trace_reading_a_tensor_made_from_a_parameter_is_traced_in_each_batch_map() -> None:
    forget()
    model = Transposed().double()
    fn = lambda x: model(torch.as_tensor(x))  # noqa: E731
    xs = _sequences(seed=6)
    first = _check(model, fn, xs)
    assert first.module_calls_cached > 0  # confirmed: reuse was possible
    with torch.no_grad():
        model.weight.mul_(3.0)  # W.t() made in the last batch_map would be stale
    again = _check(model, fn, xs)
    assert again.module_calls_traced >= 1


class Pair(nn.Module):
    """Two sequences, one by keyword, checked to have one length."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k = nn.Linear(4, 3), nn.Linear(4, 3)  # dim 4: the call of length 4 too

    def forward(self, h: torch.Tensor, *, keys: torch.Tensor) -> torch.Tensor:
        if h.shape[0] != keys.shape[0]:
            raise ValueError("one length")
        return (self.q(h) * self.k(keys)).sum(0)


def test_a_call_with_a_sequence_by_keyword_is_cached() -> None:
    model = Pair().double()
    fn = lambda x: model(torch.as_tensor(x), keys=torch.as_tensor(x).flip(-1))  # noqa: E731
    stats = _check(model, fn, _sequences(seed=5))
    assert _nodes(stats, "Pair") == len(LENGTHS) - 2


class MessagePassing(nn.Module):
    """Rounds of ``h = relu(u(h) + A @ m(h))`` on one graph: its adjacency ``[L, L]`` is an
    input of the call, read by the product only."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 5)  # 8: no call's x [L, 8] is square too
        self.u, self.m = nn.Linear(5, 5), nn.Linear(5, 5)

    def forward(self, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.embed(x))
        for _ in range(2):
            h = torch.relu(self.u(h) + a @ self.m(h)) + (a @ h[:, 0]).unsqueeze(-1)
        return h.sum(0)


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_a_module_with_an_adjacency_input_is_cached(scheduler: Scheduler) -> None:
    model = MessagePassing().double()
    gen = torch.Generator().manual_seed(6)
    graphs = [
        (x, (torch.rand(len(x), len(x), dtype=torch.float64, generator=gen) > 0.5).double())
        for x in _sequences(dim=8, seed=6, lengths=[*LENGTHS, 3, 3])
    ]
    fn = lambda g: model(torch.as_tensor(g[0]), torch.as_tensor(g[1]))  # noqa: E731
    stats = _check(model, fn, graphs, scheduler)
    assert _nodes(stats, "MessagePassing") == len(graphs) - 2


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_a_graph_with_as_many_atoms_as_features_takes_the_cached_call(scheduler: Scheduler) -> None:
    """x ``[8, 8]`` beside A ``[8, 8]``: either could be the adjacency; the cached call says."""
    model = MessagePassing().double()
    gen = torch.Generator().manual_seed(7)
    lengths = [3, 5, 8, 2, 8, 4]  # the first two confirm the call; then [8, 8] twice
    graphs = [
        (x, (torch.rand(len(x), len(x), dtype=torch.float64, generator=gen) > 0.5).double())
        for x in _sequences(dim=8, seed=7, lengths=lengths)
    ]
    fn = lambda g: model(torch.as_tensor(g[0]), torch.as_tensor(g[1]))  # noqa: E731
    stats = _check(model, fn, graphs, scheduler)
    assert _nodes(stats, "MessagePassing") == len(graphs) - 2 and not stats.module_misses
    # first in its batch, before any call is confirmed: op by op, and still eager's values
    forget()
    stats = _check(model, fn, [graphs[2], *graphs], scheduler)
    assert any(m.startswith("MessagePassing: ") for m in stats.module_misses)


def test_adjacency_calls_under_no_grad_in_some_instances_equal_eager() -> None:
    """The short path keys the grad mode as the slow one does: calls made under ``no_grad``
    neither take the trace recorded with gradients nor give gradients."""
    model = MessagePassing().double()
    gen = torch.Generator().manual_seed(8)
    graphs = [
        (x, (torch.rand(len(x), len(x), dtype=torch.float64, generator=gen) > 0.5).double(), i % 3)
        for i, x in enumerate(_sequences(dim=8, seed=8, lengths=[*LENGTHS, 8, 3, 8]))
    ]

    def fn(g: Any) -> torch.Tensor:
        with torch.set_grad_enabled(g[2] != 1):
            return model(torch.as_tensor(g[0]), torch.as_tensor(g[1]))

    got, _ = bf.batch_map(fn, graphs, return_stats=True)
    assert [o.requires_grad for o in got] == [g[2] != 1 for g in graphs]
    _check(model, fn, graphs)


class Degrees(MessagePassing):
    """Also reads the adjacency's row sums: an op on [L, L] other than the product."""

    def forward(self, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        return super().forward(x, a) * a.sum(1).mean()


def test_other_ops_on_the_adjacency_are_not_cached() -> None:
    model = Degrees().double()
    graphs = [(x, torch.ones(len(x), len(x), dtype=torch.float64)) for x in _sequences(dim=8)]
    fn = lambda g: model(torch.as_tensor(g[0]), torch.as_tensor(g[1]))  # noqa: E731
    stats = _check(model, fn, graphs)
    assert _nodes(stats, "Degrees") == 0
    assert any(m.startswith("Degrees: ") for m in stats.module_misses)


class ReadsLength(nn.Module):
    """Reads the length in ways Python does without asking an int (C-level uses)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.lin = nn.Linear(4, 4)
        self.layers = nn.ModuleList(nn.Linear(4, 4) for _ in range(4))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        n, how = h.shape[0], self.how
        if how == "slice":
            for layer in self.layers[:n]:
                h = torch.tanh(layer(h))
        elif how == "float compare":
            h = self.lin(h) if n > 4.5 else h * 2
        elif how == "numel":
            h = self.lin(h) if h.shape.numel() > 20 else h * 2
        elif how == "range":
            h = self.lin(h) * sum(1 for _ in range(n))
        elif how == "other length":  # rows picked by an index of another length
            picked = self.lin(h).index_select(0, torch.zeros(2, dtype=torch.long))
            h = picked * len(picked)
        return h.sum(0)


@pytest.mark.parametrize("how", ["slice", "float compare", "numel", "range", "other length"])
def test_every_read_of_the_length_is_seen(how: str) -> None:
    model = ReadsLength(how).double()
    _check(model, lambda x: model(torch.as_tensor(x)), _sequences(lengths=[5, 6, 7, 2, 3, 1, 4]))


def test_hooks_registered_anywhere_or_midway_run_as_eagerly() -> None:
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh()).double()
    calls = []
    handle = torch.nn.modules.module.register_module_forward_hook(
        lambda m, i, o: calls.append(type(m).__name__) if m is model else None
    )
    try:
        bf.batch_map(lambda x: model(torch.as_tensor(x)), _sequences())
    finally:
        handle.remove()
    assert len(calls) == len(LENGTHS)

    def double(module: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
        return output * 2

    def fn(item: tuple[int, torch.Tensor]) -> torch.Tensor:
        if item[0] == 4:  # from the fifth instance on, outputs are doubled
            model.register_forward_hook(double)
        return model(torch.as_tensor(item[1]))

    got = bf.batch_map(fn, list(enumerate(_sequences())))
    for i, (g, x) in enumerate(zip(got, _sequences(), strict=True)):
        torch.testing.assert_close(g, model(x) if i >= 4 else model(x) / 2)


def test_a_number_too_big_for_a_scalar_is_refused_as_eagerly() -> None:
    xs = [torch.ones(2, dtype=torch.float64) for _ in range(3)]
    with pytest.raises(Exception) as eager:
        _ = xs[0] * 2**70
    with pytest.raises(type(eager.value)):
        bf.batch_map(lambda ix: torch.as_tensor(ix[1]) * [3, 5, 2**70][ix[0]], list(enumerate(xs)))


class RandomSequenceModel(nn.Module):
    """A random chain of ops with ragged rules on ``h [L, 4]``, drawn from ``seed``."""

    STEPS = ("linear", "tanh", "softmax rows", "softmax dims", "layer_norm", "scale", "mix")

    def __init__(self, seed: int) -> None:
        super().__init__()
        rng = random.Random(seed)
        self.steps = [rng.choice(self.STEPS) for _ in range(rng.randint(2, 6))]
        self.lins = nn.ModuleList(nn.Linear(4, 4) for _ in self.steps)
        self.norm = nn.LayerNorm(4)
        self.scale = nn.Parameter(torch.randn(4))

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = h
        for step, lin in zip(self.steps, self.lins, strict=True):
            if step == "linear":
                x = lin(x)
            elif step == "tanh":
                x = torch.tanh(x) + h
            elif step == "softmax rows":
                x = torch.softmax(x, 0) * x.shape[1]
            elif step == "softmax dims":
                x = torch.log_softmax(x, -1)
            elif step == "layer_norm":
                x = self.norm(x)
            elif step == "scale":
                x = x * self.scale
            else:  # a weighted sum of the rows, broadcast back
                x = x + torch.softmax(x[:, 0], 0) @ x
        return x, x.amax(0) + x.mean(0)


@pytest.mark.parametrize("seed", range(8))
def test_random_modules_on_sequences_equal_eager(seed: int) -> None:
    model = RandomSequenceModel(seed).double()
    rng = random.Random(seed)
    lengths = [rng.randint(1, 9) for _ in range(12)]

    def fn(x: torch.Tensor) -> torch.Tensor:
        rows, pooled = model(torch.as_tensor(x))
        return rows.sum(0) * pooled

    stats = _check(model, fn, _sequences(seed=seed, lengths=lengths), ("agenda", "depth")[seed % 2])
    if len(set(lengths)) > 1:
        assert _nodes(stats, "RandomSequenceModel") > 0


class InPlaceNoGrad(nn.Module):
    """In-place ops and a no_grad block inside a call on sequences."""

    def __init__(self) -> None:
        super().__init__()
        self.lin, self.gate = nn.Linear(4, 3), nn.Linear(4, 3)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        x = self.lin(h)
        x += 1
        x.relu_()
        with torch.no_grad():
            scale = torch.sigmoid(self.gate(h)).mean(0)  # no gradient into gate
        return (x * scale).sum(0)


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_in_place_ops_and_no_grad_inside_a_cached_call(scheduler: Scheduler) -> None:
    model = InPlaceNoGrad().double()
    stats = _check(model, lambda x: model(torch.as_tensor(x)), _sequences(), scheduler)
    assert _nodes(stats, "InPlaceNoGrad") == len(LENGTHS) - 2
    got = bf.batch_map(lambda x: model(torch.as_tensor(x)), _sequences())
    grads = torch.autograd.grad(_weighted(got), [model.gate.weight], allow_unused=True)
    assert grads[0] is None  # as eagerly: the gate ran without grad


def test_a_submodule_switched_to_eval_alone_is_honoured() -> None:
    # the call's key holds the outer module's mode; a submodule's own mode must count too
    model = nn.Sequential(nn.Linear(4, 6), nn.Dropout(0.5)).double().train()
    xs = [torch.randn(n, 4, dtype=torch.float64) for n in (2, 3, 5, 4)]
    fn = lambda x: model(torch.as_tensor(x)).sum(0)  # noqa: E731
    bf.batch_map(fn, xs)  # traced and confirmed with the dropout on
    bf.batch_map(fn, xs)
    model[1].eval()
    for g, x in zip(bf.batch_map(fn, xs), xs, strict=True):
        torch.testing.assert_close(g, model[0](x).sum(0))
    model.eval()
    model[1].train()  # the outer module in eval, its dropout training: eager drops
    got = bf.batch_map(fn, xs)
    assert any(not torch.allclose(g, model[0](x).sum(0)) for g, x in zip(got, xs, strict=True))
