"""A module call kept from an earlier batch_map is checked by a dry trace in each later one.

A kept template holds as constants the numbers its forward read, from the module's attributes
(which the kept state compares) and from anywhere else: a global, a class attribute, a
closure cell. Changed between two batch_map calls (a temperature annealed between epochs),
such a number made the kept template replay the old value, silently.
"""

from __future__ import annotations

import contextlib
import copy
import random
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import batchfold as bf
from batchfold.lazy.context import DRY_NODES, active_recorder
from batchfold.lazy.kept import forget
from reference import assert_matches_eager

pytestmark = pytest.mark.usefixtures("float64")

SCALE = 1.0  # read by Scaled.forward as a global
FLAGS = {"sync": False, "bad": False}


class Scaled(nn.Module):
    """Several ops (so that the call is kept), a class attribute and a global among them."""

    temperature = 1.0

    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x: Any) -> Any:
        h = torch.tanh(self.lin(x)) / self.temperature
        if FLAGS["sync"] and float(h.detach().sum()) > 1e9:  # a sync point when switched on
            h = h * 0
        if FLAGS["bad"]:
            h = h @ torch.ones(3, 3, dtype=h.dtype)  # a shape error when switched on
        return h * SCALE + 1


def _closure_module(factor: list[float]) -> nn.Module:
    class Closed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: Any) -> Any:
            return torch.sigmoid(self.lin(x)) * factor[0] - 1

    return Closed()


def _xs(sequences: bool, seed: int) -> list[torch.Tensor]:
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    shapes = [((rng.randint(1, 6), 4) if sequences else (4,)) for _ in range(6)]
    return [torch.randn(*shape, generator=gen) for shape in shapes]


@pytest.fixture(autouse=True)
def _reset() -> Any:
    global SCALE
    forget()
    yield
    SCALE = 1.0
    Scaled.temperature = 1.0
    FLAGS.update(sync=False, bad=False)
    NOISE[0] = None
    forget()


@pytest.mark.parametrize("sequences", [False, True])
def test_a_global_or_class_attribute_changed_between_runs_is_read_anew(sequences: bool) -> None:
    global SCALE
    model = Scaled()
    fn = lambda x: model(torch.as_tensor(x))  # noqa: E731
    first = assert_matches_eager(fn, _xs(sequences, 0), model)
    assert first.module_calls_cached > 0
    again = assert_matches_eager(fn, _xs(sequences, 1), model)
    assert again.module_calls_traced == 0  # unchanged: the kept template, checked dry
    SCALE = 3.0
    assert_matches_eager(fn, _xs(sequences, 2), model)  # failed before: 1.0 replayed
    Scaled.temperature = 2.0
    assert_matches_eager(fn, _xs(sequences, 3), model)  # failed before: 1.0 replayed
    assert assert_matches_eager(fn, _xs(sequences, 4), model).module_calls_cached > 0


class Pooled(nn.Module):
    """A pooling over rows that a global switches to one without a ragged rule."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: Any) -> Any:
        h = torch.tanh(self.lin(x))
        return h.cumsum(0)[-1] if FLAGS["bad"] else h.sum(0)


def test_a_kept_call_on_sequences_now_without_a_ragged_rule_is_traced_again() -> None:
    """The dry trace's template could not be made a ragged one: an AttributeError inside."""
    model = Pooled()
    fn = lambda x: model(torch.as_tensor(x))  # noqa: E731
    xs = [x for x in _xs(True, 0) if len(x)]
    assert_matches_eager(fn, xs, model)
    assert_matches_eager(fn, xs, model)  # kept
    FLAGS["bad"] = True
    assert_matches_eager(fn, xs, model)


def test_a_closure_cell_changed_between_runs_is_read_anew() -> None:
    factor = [1.0]
    model = _closure_module(factor)
    fn = lambda x: model(torch.as_tensor(x))  # noqa: E731
    assert_matches_eager(fn, _xs(False, 0), model)
    assert_matches_eager(fn, _xs(False, 1), model)
    factor[0] = -2.5
    assert_matches_eager(fn, _xs(False, 2), model)


@pytest.mark.parametrize("sequences", [False, True])
def test_a_dry_trace_that_reads_or_raises_leaves_the_call_to_a_real_trace(
    sequences: bool,
) -> None:
    model = Scaled()
    fn = lambda x: model(torch.as_tensor(x))  # noqa: E731
    assert_matches_eager(fn, _xs(sequences, 0), model)
    FLAGS["sync"] = True  # now the forward reads a value: recorded op by op, as eagerly
    stats = assert_matches_eager(fn, _xs(sequences, 1), model)
    assert stats.syncs > 0
    FLAGS["sync"] = False
    assert_matches_eager(fn, _xs(sequences, 2), model)
    FLAGS["bad"] = True  # now the forward raises: so does batch_map, naming the line
    with pytest.raises(RuntimeError):
        [fn(x) for x in _xs(sequences, 3)]
    with pytest.raises(bf.ShapeError, match=r"matmul at .*test_kept_checks.py:\d+ \(in forward\)"):
        bf.batch_map(fn, _xs(sequences, 3))


def test_a_dry_trace_leaves_nothing_in_the_graph() -> None:
    model = Scaled()
    seen: list[Any] = []

    def fn(x: Any) -> Any:
        out = model(torch.as_tensor(x))
        recorder = active_recorder()
        assert recorder is not None
        graph = recorder.graph
        seen.append((graph.pending, set(graph.grad_free), set(recorder._views_of)))
        return out

    bf.batch_map(fn, _xs(False, 0))
    seen.clear()
    _, stats = bf.batch_map(fn, _xs(False, 1), return_stats=True)
    assert stats.module_calls_traced == 0 and stats.module_calls_cached == len(seen)
    assert seen[0][0] == 2  # the first call: its source and one node, no traced ops
    for _, grad_free, views in seen:
        assert all(v >> 16 < DRY_NODES for v in grad_free | views)


NOISE: list[Any] = [None]  # a draw a global switches on in Noisy.forward
DRAWS: dict[str, Any] = {
    "torch.randn": lambda h: h + 0.1 * torch.randn(4),
    "empty().normal_()": lambda h: h + torch.empty(4).normal_(),
    "random.gauss": lambda h: h * random.gauss(1.0, 0.1),
    "np.random.rand": lambda h: h * float(np.random.rand()),
}


class Noisy(nn.Module):
    """Noise, a counter buffer and attribute, a write into the argument, a sign and a read
    caught by ``except BaseException``: each switched on by a global between runs."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.calls = 0
        self.register_buffer("seen", torch.zeros(()))
        self.sign = 0.0
        self.mode = ""

    def forward(self, x: Any) -> Any:
        if NOISE[0] == "write":
            x.mul_(2)  # into the caller's value
        h = torch.tanh(self.lin(x))
        if NOISE[0] in DRAWS:
            h = DRAWS[NOISE[0]](h)
        if NOISE[0] == "count":
            self.get_buffer("seen").add_(1)
            self.calls += 1
        total = h.detach().sum()  # recorded either way: the ops alone do not differ
        if NOISE[0] == "caught":
            with contextlib.suppress(BaseException):  # as a bare except would
                h = h / float(total)
        return torch.copysign(h, torch.tensor(-0.0 if NOISE[0] == "sign" else 0.0)) + 1


def _seeded(fn: Any) -> Any:
    torch.manual_seed(7)
    random.seed(7)
    np.random.seed(7)
    return fn()


@pytest.mark.parametrize("change", [*DRAWS, "count", "write", "sign", "caught"])
@pytest.mark.parametrize("sequences", [False, True])
def test_a_dry_trace_that_differs_leaves_nothing_done(change: str, sequences: bool) -> None:
    """The dry trace of a kept call whose forward now draws, counts, writes into its argument,
    flips a zero's sign or catches the stop of its read: it drew numbers the real trace drew
    again (every instance got the next one's), moved the counters twice, crashed on the value
    it rebound, or matched the kept template where it should not have."""
    model = Noisy()
    fn = lambda x: model(torch.as_tensor(x) * 1.0)  # noqa: E731
    xs = _xs(sequences, 0)
    NOISE[0] = None
    bf.batch_map(fn, xs)
    bf.batch_map(fn, xs)  # kept
    NOISE[0] = change
    eager_model = copy.deepcopy(model)
    eager_fn = lambda x: eager_model(torch.as_tensor(x) * 1.0)  # noqa: E731
    want = _seeded(lambda: [eager_fn(x) for x in xs])
    got = _seeded(lambda: bf.batch_map(fn, xs))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
        assert torch.equal(g.signbit(), w.signbit())
    counts = [(m.calls, float(m.get_buffer("seen"))) for m in (model, eager_model)]
    assert counts[0] == counts[1]


def test_kept_calls_on_sequences_across_grad_modes_and_weight_updates() -> None:
    """A kept call checked dry in runs under grad, no_grad and inference_mode, with the
    weights updated in place between runs: values, flags, dtypes and gradients as eager."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
    fn = lambda x: model(torch.as_tensor(x)).sum(0) * 0.5  # noqa: E731
    xs = [torch.randn(n, 4) for n in (3, 1, 5, 2, 4)]
    params = list(model.parameters())
    for step in range(6):
        mode = (torch.enable_grad, torch.no_grad, torch.inference_mode)[step % 3]
        with mode():
            got, want = bf.batch_map(fn, xs), [fn(x) for x in xs]
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w)
            assert (g.requires_grad, g.dtype) == (w.requires_grad, w.dtype)
        if step % 3 == 0:
            ours = torch.autograd.grad(torch.stack(got).sum(), params)
            theirs = torch.autograd.grad(torch.stack(want).sum(), params)
            for a, b in zip(ours, theirs, strict=True):
                torch.testing.assert_close(a, b)
            with torch.no_grad():
                for p, g in zip(params, theirs, strict=True):
                    p.sub_(0.1 * g)
