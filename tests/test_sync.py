"""Sync points: reads inside batch_map pause an instance and batch across instances."""

from __future__ import annotations

import contextvars
import random
from typing import Any

import pytest
import torch
import torch.utils.checkpoint
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import batchfold as bf
from batchfold.execute import Executor
from batchfold.schedule import Scheduler
from reference import assert_matches_eager

pytestmark = pytest.mark.usefixtures("float64")


class Decoder(nn.Module):
    """A toy greedy decoder: a GRU cell that stops at token 0 or after ``limit`` steps."""

    def __init__(self, vocab: int = 5, hidden: int = 6) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.cell = nn.GRUCell(hidden, hidden)
        self.out = nn.Linear(hidden, vocab)

    def decode(self, start: tuple[int, int]) -> tuple[list[int], torch.Tensor]:
        """Greedy tokens and their summed log-probabilities, one instance at a time."""
        token, limit = start
        h = torch.zeros(self.cell.hidden_size) + token * 0.1
        tokens: list[int] = []
        score = torch.zeros(())
        while len(tokens) < limit:
            h = self.cell(self.embed(torch.tensor(token)), h)
            logp = torch.log_softmax(self.out(h), -1)
            token = int(logp.argmax().item())  # a sync point
            score = score + logp[token]
            tokens.append(token)
            if token == 0:
                break
        return tokens, score


def test_greedy_decoder_equals_eager_and_syncs_once_per_step() -> None:
    model = Decoder()
    rng = random.Random(1)
    starts = [(rng.randrange(1, 5), rng.randrange(1, 12)) for _ in range(40)]
    eager = [model.decode(s) for s in starts]
    batched, stats = bf.batch_map(model.decode, starts, return_stats=True)
    assert [tokens for tokens, _ in batched] == [tokens for tokens, _ in eager]
    for (_, got), (_, want) in zip(batched, eager, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    longest = max(len(tokens) for tokens, _ in eager)
    assert stats.syncs == longest  # one batched run per decoding step, not per instance
    assert stats.segments == longest + 1  # plus the final run of the scores


def test_greedy_decoder_gradients_match_eager() -> None:
    model = Decoder()
    starts = [(t, n) for t in range(1, 5) for n in (1, 4, 9)]
    assert_matches_eager(lambda s: model.decode(s)[1], starts, module=model)


def test_256_decoders_of_different_lengths_batch_per_time_step() -> None:
    lin = nn.Linear(3, 3)

    def countdown(n: int) -> torch.Tensor:
        x = torch.ones(3) * 0.01
        left = torch.tensor(n)
        while left.item() > 0:  # data-dependent stop, read every step
            x = torch.tanh(lin(x))
            left = left - 1
        return x

    lengths = [random.Random(i).randrange(0, 30) for i in range(256)]
    stats = assert_matches_eager(countdown, lengths, module=lin)
    assert stats.syncs == max(lengths) + 1
    # each time step runs linear, tanh and sub once for all instances still going
    assert stats.steps <= 3 * (max(lengths) + 1) + 3


@given(st.lists(st.integers(0, 9), min_size=1, max_size=12))
@settings(max_examples=25, deadline=None)
def test_instances_sync_a_different_number_of_times(values: list[int]) -> None:
    lin = nn.Linear(2, 2)

    def collatz_like(n: int) -> Any:
        x = torch.tensor([float(n), 1.0])
        count = 0
        while x[0] > 1 and count < 6:  # comparison read in a while
            x = x / 2 + lin(x) * 0.01 if bool(x[0] % 2 < 1) else x * 0.5
            count += 1
        return lin(x), count

    assert_matches_eager(collatz_like, values, module=lin)


def test_sync_points_inside_recursion() -> None:
    lin = nn.Linear(4, 4)

    def grow(x: torch.Tensor, depth: int) -> torch.Tensor:
        y = torch.tanh(lin(x))
        if depth < 6 and y.sum() > -0.5:  # read deep inside the recursion
            return grow(y, depth + 1) + grow(y * 0.5, depth + 2)
        return y

    seeds = [torch.randn(4).tolist() for _ in range(12)]
    stats = assert_matches_eager(lambda s: grow(torch.tensor(s), 0), seeds, module=lin)
    assert stats.syncs > 1


def test_gradients_flow_through_values_before_and_after_a_read() -> None:
    lin = nn.Linear(3, 3)

    def fn(v: list[float]) -> torch.Tensor:
        before = lin(torch.tensor(v))
        scale = before.sum().item()  # the read: before it, `before`; after it, `after`
        after = lin(before * scale)
        return before * after

    assert_matches_eager(fn, [[1.0, 2.0, 3.0], [0.5, -1.0, 0.0], [3.0, 3.0, -2.0]], module=lin)


def test_an_instance_that_raises_names_its_index_and_leaves_others_intact() -> None:
    lin = nn.Linear(2, 2)

    def fn(n: int) -> torch.Tensor:
        x = lin(torch.ones(2) * n)
        if x.sum().item() and n == 3:
            raise ValueError(f"bad instance {n}")
        return x

    with pytest.raises(ValueError, match="bad instance 3") as info:
        bf.batch_map(fn, range(6))
    assert "(raised by instance 3 of batch_map)" in getattr(info.value, "__notes__", [])
    outs = bf.batch_map(fn, [0, 1, 2])  # the engine is usable right after
    for n, out in zip([0, 1, 2], outs, strict=True):
        torch.testing.assert_close(out, lin(torch.ones(2) * n))


def test_no_instance_starts_after_one_raised() -> None:
    ran = []

    def fn(n: int) -> int:
        ran.append(n)
        if n == 0:
            try:
                return int(torch.ones(()) * 2)  # waits for a value
            except BaseException:  # told to exit after instance 1 raised: it returns
                return -1
        if n == 1:
            raise ValueError("instance 1")
        return n

    with pytest.raises(ValueError, match="instance 1"):
        bf.batch_map(fn, range(5))
    assert ran == [0, 1]  # as eagerly: instances 2-4 never ran


def test_grad_mode_set_inside_one_instance_does_not_leak() -> None:
    lin = nn.Linear(2, 2)

    def fn(n: int) -> torch.Tensor:
        x = torch.ones(2) * n
        if n % 2:
            with torch.no_grad():
                x.sum().item()  # pauses inside no_grad; others run meanwhile
                assert not torch.is_grad_enabled()
        else:
            x.sum().item()
        assert torch.is_grad_enabled()
        return lin(x)

    outs = bf.batch_map(fn, range(4))
    assert all(out.requires_grad for out in outs)
    assert torch.is_grad_enabled()


def test_a_read_inside_inference_mode_leaves_it_to_that_instance() -> None:
    """A read inside ``torch.inference_mode()`` paused with inference mode on: the batch and
    the other instances ran in it (their results without grad), and it stayed on after
    ``batch_map`` returned."""
    lin = nn.Linear(2, 2).double()

    def fn(n: int) -> torch.Tensor:
        x = torch.ones(2, dtype=torch.float64) * n
        if n % 2:
            with torch.inference_mode():
                v = float(lin(x).sum())  # pauses inside inference mode; others run meanwhile
                assert torch.is_inference_mode_enabled()
        else:
            v = float(x.sum())
        assert not torch.is_inference_mode_enabled()
        return lin(x) * v

    outs, want = bf.batch_map(fn, range(4)), [fn(n) for n in range(4)]
    assert [o.requires_grad for o in outs] == [w.requires_grad for w in want] == [True] * 4
    for o, w in zip(outs, want, strict=True):
        torch.testing.assert_close(o, w)
    assert not torch.is_inference_mode_enabled() and torch.is_grad_enabled()
    assert lin(torch.ones(2, dtype=torch.float64)).requires_grad


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.bool,
    ],
)
def test_numbers_read_from_0_d_values_are_eagers(dtype: torch.dtype) -> None:
    """``int()``, ``float()``, ``bool()`` and ``.item()`` of 0-d values read the step's numbers
    without the value's tensor: the same numbers and Python types as eager; other shapes and
    complex values read through the tensor, and raise where eager raises."""
    gen = torch.Generator().manual_seed(0)
    xs = [(torch.randn(3, generator=gen) * 4).to(dtype) for _ in range(6)]

    def fn(x: torch.Tensor) -> list[Any]:
        x = torch.as_tensor(x)
        v = x.sum() if dtype is not torch.bool else x.any()
        first = x[0]
        reads = [int(v), float(v), bool(v), v.item(), first.item(), int(x.max()), float(first)]
        z = torch.complex(x[:2].float(), x[1:].float())[0]
        return [*reads, z.item(), x[:1].item(), float(x[1:2])]

    got = bf.batch_map(fn, xs)
    want = [fn(x) for x in xs]
    assert got == want
    assert [[type(r) for r in g] for g in got] == [[type(r) for r in w] for w in want]
    with pytest.raises(RuntimeError, match="ambiguous"):  # as eager: bool() of 3 elements
        bf.batch_map(lambda x: bool(torch.as_tensor(x) > 0), xs[:2])


def test_a_decoder_reads_its_tokens_without_their_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    tensors_read = []
    value = Executor.value
    monkeypatch.setattr(Executor, "value", lambda self, v: tensors_read.append(v) or value(self, v))
    model = Decoder()
    starts = [(1, 5), (2, 9), (3, 2), (4, 7)]
    got = bf.batch_map(lambda s: model.decode(s)[0], starts)
    assert got == [model.decode(s)[0] for s in starts] and not tensors_read


class _Twice(torch.overrides.TorchFunctionMode):
    """Doubles what torch.ones makes."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
        out = func(*args, **(kwargs or {}))
        return out * 2 if func is torch.ones else out


def test_a_mode_an_instance_entered_stays_with_it_across_a_read() -> None:
    # instance 0 paused at a read inside its block; the others recorded under its mode
    # (torch.device("meta") put their tensors on the meta device)
    def fn(i: int) -> Any:
        if i == 0:
            with _Twice():
                read = int(torch.tensor(i) + 1)
            return read, torch.ones(2)
        ones = torch.ones(2)  # recorded while instance 0 waits
        with torch.device("meta") if i == 1 else _Twice():
            made = torch.zeros(2)
        return int(torch.tensor(i) + 1), ones, made.device.type, torch.zeros(1).device.type

    got, want = bf.batch_map(fn, [0, 1, 2]), [fn(i) for i in range(3)]
    for g, w in zip(got, want, strict=True):
        assert g[0] == w[0] and torch.equal(g[1], w[1]) and g[2:] == w[2:]


_SCALE: contextvars.ContextVar[float] = contextvars.ContextVar("scale", default=1.0)


def test_the_callers_context_variables_are_seen_inside() -> None:
    # each instance ran in a greenlet with an empty context: the default, not the caller's
    token = _SCALE.set(10.0)
    try:
        got = bf.batch_map(lambda x: torch.tensor(x) * _SCALE.get(), [1.0, 2.0])
    finally:
        _SCALE.reset(token)
    assert [g.item() for g in got] == [10.0, 20.0]


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_a_context_variable_set_around_a_read_is_each_instances_own(scheduler: str) -> None:
    """Instances shared the caller's context: one waiting inside ``with`` saw the value the
    next instance set, and the caller's variable kept the last set after the run."""

    def fn(v: float) -> Any:
        x = torch.tensor(v)
        at_start = _SCALE.get()
        token = _SCALE.set(v * 10)
        try:
            y = x * _SCALE.get()
            if y > 0:  # a sync point inside the block
                y = y + 1
            inside = _SCALE.get()
        finally:
            _SCALE.reset(token)
        return y, at_start, inside

    items = [1.0, 2.0, 3.0]
    want = [(float(y), a, b) for y, a, b in (fn(v) for v in items)]
    got = bf.batch_map(fn, items, scheduler=scheduler)  # type: ignore[arg-type]
    assert [(float(y), a, b) for y, a, b in got] == want
    assert _SCALE.get() == 1.0


def test_a_context_variable_left_set_reaches_later_instances_and_the_caller() -> None:
    """A counter kept in a ContextVar, set and never reset, counts as eagerly."""
    calls: contextvars.ContextVar[int] = contextvars.ContextVar("calls", default=0)

    def fn(x: float) -> Any:
        calls.set(calls.get() + 1)
        return torch.tensor(x) * calls.get()

    want = [fn(x).item() for x in (1.0, 1.0, 1.0)]
    assert calls.get() == 3
    calls.set(0)
    got = bf.batch_map(fn, [1.0, 1.0, 1.0])
    assert [g.item() for g in got] == want and calls.get() == 3


def test_context_variables_holding_tensors_and_sets_before_an_error_reach_the_caller() -> None:
    """The copy-back compared contexts with ``==``: a tensor value raised "Boolean value of
    Tensor ... is ambiguous"; and an instance that raised left its sets behind."""
    held: contextvars.ContextVar[torch.Tensor] = contextvars.ContextVar("held")
    last: contextvars.ContextVar[str] = contextvars.ContextVar("last", default="")

    made = [torch.full((3,), float(i)) for i in range(3)]  # tensors from outside: not lazy

    def fn(i: int) -> torch.Tensor:
        held.set(made[i])
        last.set(f"instance {i}")
        if i == 2:
            raise KeyError("instance 2")
        return torch.tensor(float(i)) * 2

    held.set(torch.zeros(3))
    bf.batch_map(fn, [0, 1])
    assert held.get().tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(KeyError):
        bf.batch_map(fn, [0, 1, 2])
    assert last.get() == "instance 2"


def test_a_list_of_instances_that_grows_after_its_last_started_is_refused() -> None:
    """Work appended by an instance resumed after a sync point was dropped silently."""
    work = [1, 2]

    def fn(n: int) -> torch.Tensor:
        x = torch.tensor(float(n))
        if x.item() < 4:  # a sync point: the appends below come after both instances started
            work.append(n + 2)
        return x * 2

    with pytest.raises(ValueError, match="grew to 4 while batch_map ran its 2"):
        bf.batch_map(fn, work)


def test_the_error_that_comes_up_is_the_first_instances_in_eager_order() -> None:
    # instance 1 raised before its read while instance 0 waited at its own: instance 1's
    # error came up, where eagerly instance 0 runs (and raises) first; instances after the
    # one that raises do not run on past their reads
    after_read: list[int] = []

    def fn(item: tuple[int, str]) -> Any:
        index, kind = item
        if kind == "early":
            raise KeyError("before any read")
        h = torch.tensor([1.0, 2.0]) * index
        if h.sum().item() >= 0:  # a sync point
            after_read.append(index)
            if kind == "late":
                raise ValueError(f"instance {index} after its read")
        return h

    with pytest.raises(ValueError, match="instance 0 after its read"):
        bf.batch_map(fn, [(0, "late"), (1, "early")])
    after_read.clear()
    with pytest.raises(KeyError):  # the earlier instance finishes: the later one's error
        bf.batch_map(fn, [(0, "fine"), (1, "early"), (2, "fine")])
    assert after_read == [0]  # instance 2, after the one that raised, never went on


def test_a_checkpointed_function_with_a_read_inside_gives_eagers_gradients() -> None:
    # its saved-tensor hooks stayed on while the batch ran at the read: the batched ops saved
    # through them, and backward recomputed the function on lazy values (LazyValueError)
    layer = nn.Linear(4, 4).double()

    def body(a: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(layer(a))
        return h * (int(h.argmax()) + 1)  # a sync point inside the checkpoint

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.utils.checkpoint.checkpoint(body, torch.as_tensor(x), use_reentrant=False)

    items = [torch.randn(4, dtype=torch.float64) for _ in range(3)]
    assert_matches_eager(fn, items, layer)


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_a_checkpoint_around_batch_map_recomputes_it_as_eager_code(scheduler: Scheduler) -> None:
    # the checkpoint's signal that it had recomputed enough was wrapped as a rule's failure
    layer, weight = nn.Linear(3, 3).double(), nn.Parameter(torch.randn(3, dtype=torch.float64))
    fn = lambda x: torch.tanh(layer(torch.as_tensor(x))).sum(0) * weight  # noqa: E731

    def grads(batched: bool) -> list[torch.Tensor]:
        torch.manual_seed(1)
        xs = [torch.randn(n, 3, dtype=torch.float64, requires_grad=True) for n in (2, 3)]

        def whole(*items: torch.Tensor) -> torch.Tensor:
            outs = bf.batch_map(fn, list(items), scheduler=scheduler) if batched else map(fn, items)
            return torch.stack(list(outs))

        loss = torch.utils.checkpoint.checkpoint(whole, *xs, use_reentrant=False).pow(2).sum()
        return list(torch.autograd.grad(loss, [*layer.parameters(), weight, *xs]))

    for got, want in zip(grads(True), grads(False), strict=True):
        torch.testing.assert_close(got, want)
