"""``requires_grad`` of recorded values equals eager's, also where one step mixes both kinds.

A step runs nodes whose inputs require grad beside nodes whose inputs do not (``tanh`` of a
layer's output and ``tanh`` of a raw input): its one output tensor requires grad, so values
eager PyTorch gives ``requires_grad=False`` are handed back detached. Ops without gradients
(``zeros_like``, ``detach``, integer outputs), grad modes, cached module calls and
``Lazy.requires_grad`` follow eager too; a write outside grad mode into a tensor that requires
grad, which recording cannot reproduce, is refused.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import batchfold as bf
from batchfold.errors import UnsupportedOpError
from batchfold.schedule import Scheduler
from reference import assert_matches_eager

SCHEDULERS = ["agenda", "depth"]


def _inputs(n: int, size: int = 3) -> list[torch.Tensor]:
    torch.manual_seed(n)
    return [torch.randn(size, dtype=torch.float64) for _ in range(n)]


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_a_step_of_both_kinds_hands_back_eagers_flags(scheduler: Scheduler) -> None:
    lin = nn.Linear(3, 3).double()

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = torch.as_tensor(x)
        h, r = lin(a), torch.relu(a)  # both one op from the input: one tanh step below
        return torch.tanh(h), torch.tanh(r), torch.tanh(r) * h, torch.tanh(r) + 1.0

    stats = assert_matches_eager(fn, _inputs(6), lin, scheduler)
    assert stats.plan is not None
    tanh_steps = [s for s in stats.plan.steps if s.sig.name == "tanh"]
    assert sum(len(s.nodes) for s in tanh_steps) == 24 and len(tanh_steps) == 1


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_ops_without_gradients_and_integer_outputs(scheduler: Scheduler) -> None:
    lin = nn.Linear(3, 4).double()

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = lin(torch.as_tensor(x))
        values, index = h.max(0)
        made = torch.zeros(4, dtype=torch.float64, requires_grad=True)
        return (
            torch.tanh(torch.zeros_like(h)),
            torch.tanh(h.detach()),
            torch.tanh(h.new_ones(4)),
            torch.tanh(torch.full_like(h, 0.5)),
            torch.tanh(index.double()) + values,
            torch.tanh(h.argmax().double()),
            torch.tanh(made) * 2,
            torch.tanh(h),
        )

    assert_matches_eager(fn, _inputs(5), lin, scheduler)


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_grad_modes_and_views(scheduler: Scheduler) -> None:
    lin = nn.Linear(3, 3).double()

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = torch.as_tensor(x)
        h = lin(a)
        with torch.no_grad():
            kept = h[1:]  # a view keeps its base's flag, outside grad mode too
            copied = torch.tanh(h)
            view_of_raw = a[1:]
        with torch.no_grad(), torch.enable_grad():
            inner = torch.tanh(a) * h
        return kept * 1.0, copied, view_of_raw, torch.tanh(copied), inner

    assert_matches_eager(fn, _inputs(5), lin, scheduler)


_NO_GRAD_CALLS = {
    "cpu": lambda h: h.cpu(),  # hands back h itself: keeps h's flag and gradient path
    "conj": lambda h: h.conj(),
    "positive": torch.positive,
    "atleast_1d": torch.atleast_1d,
    "sum_to_size": lambda h: h.sum_to_size(3),
    "adjoint_of_rows": lambda h: h[None].adjoint(),
    "mul": lambda h: h * 2.0,  # a new tensor: no flag
    "tanh": torch.tanh,
}


@pytest.mark.parametrize("name", list(_NO_GRAD_CALLS))
@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_calls_outside_grad_mode_keep_what_eager_keeps(name: str, mode: str) -> None:
    lin, call = nn.Linear(3, 3).double(), _NO_GRAD_CALLS[name]
    context = torch.no_grad if mode == "no_grad" else torch.inference_mode

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = lin(torch.as_tensor(x))
        with context():
            out = call(h)
        return out, h

    assert_matches_eager(fn, _inputs(4), lin)


_FRESH_OUTSIDE_GRAD = {
    "cumsum": lambda h: h.cumsum(0),
    "flip": lambda h: h.flip(0),
    "sort": lambda h: h.sort(0).values,
    "diff": lambda h: h.diff(dim=0),
    "roll": lambda h: h.roll(1, 0),
}


@pytest.mark.parametrize("name", list(_FRESH_OUTSIDE_GRAD))
@pytest.mark.parametrize("ragged", [True, False])
def test_a_new_tensor_made_outside_grad_mode_requires_no_grad(name: str, ragged: bool) -> None:
    # such a value added to a factory's ones required grad when the ones shared a step with
    # rows that do (the instances' own inputs): eagerly nothing of it requires grad
    call = _FRESH_OUTSIDE_GRAD[name]

    def fn(x: torch.Tensor) -> torch.Tensor:
        h = torch.as_tensor(x)
        with torch.no_grad():
            h = call(h)
        return torch.ones(h.shape, dtype=h.dtype) + h

    xs = [torch.randn(n, 4, dtype=torch.float64, requires_grad=True) for n in (2, 3)]
    eager = [fn(x) for x in xs]
    got = bf.batch_map(fn, xs, ragged=ragged)
    assert [g.requires_grad for g in got] == [e.requires_grad for e in eager] == [False] * 2


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_writes_keep_the_targets_flag(scheduler: Scheduler) -> None:
    lin = nn.Linear(3, 3).double()

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = torch.as_tensor(x)
        h = lin(a)
        free = a.clone()
        with torch.no_grad():
            free.copy_(h)  # into a tensor without grad: still none
        filled = a.clone().fill_(h.sum())  # a 0-d lazy value: its gradient flows
        made = torch.zeros_like(h, requires_grad=True) * 2
        zeroed, refilled = h * 1.0, h * 1.0
        zeroed.zero_()  # in grad mode: still requires grad, as eagerly (with zero gradient)
        refilled.fill_(2.0)
        return free * h, filled, made, zeroed, refilled

    assert_matches_eager(fn, _inputs(4), lin, scheduler)


class _Scale(nn.Module):
    def __init__(self, weight: bool) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(3, dtype=torch.float64)) if weight else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(x) * 2.0
        return y * self.w if self.w is not None else y


@pytest.mark.parametrize("weight", [True, False])
@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_cached_module_calls_on_inputs_with_and_without_grad(
    scheduler: Scheduler, weight: bool
) -> None:
    lin, scale = nn.Linear(3, 3).double(), _Scale(weight)
    model = nn.ModuleList([lin, scale])

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = torch.as_tensor(x)
        return scale(a), scale(lin(a))

    stats = assert_matches_eager(fn, _inputs(6), model, scheduler)
    assert stats.module_calls_cached > 0


class _Outputs(nn.Module):
    """Outputs that require grad for different reasons: a weight, one input, another, none."""

    def __init__(self, index: bool = True) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3).double()
        self.index = index  # argmax has no rule for rows of varying length

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outs = (torch.sigmoid(a) * 2, self.lin(a), b.tanh(), a.detach() * b)
        return (*outs, (a + b).argmax()) if self.index else outs


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_each_output_of_a_cached_call_requires_grad_as_eager(scheduler: Scheduler) -> None:
    """A cached call's node has outputs of every kind; each follows eager's rule for it, in
    steps that mix calls on inputs with and without grad (a chain: the second call of an
    instance reads what its first made with the weight)."""
    outputs = _Outputs()

    def fn(x: torch.Tensor) -> list[torch.Tensor]:
        a = torch.as_tensor(x)
        first = outputs(a, a * 2)  # no input requires grad
        second = outputs(first[0], first[1])  # the second input does (the weight)
        third = outputs(first[1], a)  # the first one does
        return [*first, *second, *third]

    stats = assert_matches_eager(fn, _inputs(6), outputs, scheduler)
    assert stats.module_calls_cached > 0 and not stats.module_misses

    lengths = [3, 1, 4, 2, 5]
    seqs = [torch.randn(n, 3, dtype=torch.float64) for n in lengths]  # on rows of any length
    on_rows = _Outputs(index=False)

    def rows(x: torch.Tensor) -> list[torch.Tensor]:
        a = torch.as_tensor(x)
        first = on_rows(a, a * 2)
        return [o.sum(0) for o in (*first, *on_rows(first[1], a))]

    stats = assert_matches_eager(rows, seqs, on_rows, scheduler)
    assert stats.module_calls_cached > 0 and not stats.module_misses  # as a ragged macro


def test_lazy_requires_grad_reads_as_eager() -> None:
    lin = nn.Linear(3, 3).double()
    seen: list[list[bool]] = []

    def fn(x: torch.Tensor) -> torch.Tensor:
        a = torch.as_tensor(x)
        h = lin(a)
        with torch.no_grad():
            q = h * 2
        flags = [a.requires_grad, h.requires_grad, torch.tanh(a).requires_grad, q.requires_grad]
        flags += [h.detach().requires_grad, h.argmax().requires_grad, (a + h).requires_grad]
        seen.append(flags)
        return h

    inputs = _inputs(3)
    eager = [fn(x) for x in inputs]
    want, seen[:] = list(seen), []
    bf.batch_map(fn, inputs)
    assert seen == want and len(eager) == 3
    assert want[0] == [False, True, False, False, False, False, True]


def test_a_write_outside_grad_mode_into_a_tensor_that_requires_grad_is_refused() -> None:
    lin = nn.Linear(3, 3).double()

    def fn(x: torch.Tensor) -> torch.Tensor:
        h = lin(torch.as_tensor(x))
        with torch.no_grad():
            h.add_(1.0)
        return h

    with pytest.raises(UnsupportedOpError, match=r"add_\(\) at .*test_requires_grad.py:\d+"):
        bf.batch_map(fn, _inputs(2))


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_a_write_outside_grad_mode_into_a_tensor_without_grad_records(
    scheduler: Scheduler,
) -> None:
    lin = nn.Linear(3, 3).double()

    def fn(x: torch.Tensor) -> torch.Tensor:
        a = torch.as_tensor(x).clone()
        with torch.no_grad():
            a.mul_(2.0)
            a[0] = 1.0
        return lin(a)

    assert_matches_eager(fn, _inputs(4), lin, scheduler)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")
def test_a_torchscript_module_passes_its_weights_gradients_on() -> None:
    torch.manual_seed(0)
    script = torch.jit.script(torch.nn.Linear(4, 2).double())
    xs = [torch.randn(4, dtype=torch.float64) for _ in range(3)]
    assert_matches_eager(lambda x: torch.tanh(script(torch.as_tensor(x))), xs, script)


LENDERS = {  # an op whose other tensors lend a shape or dtype: its output follows t alone
    "view_as": lambda t, h: t.view_as(h),
    "type_as": lambda t, h: t.type_as(h),
    "expand_as": lambda t, h: t[:1].expand_as(h),
    "reshape_as": lambda t, h: t.reshape_as(h),
    "to": lambda t, h: t.to(h),
    "broadcast_tensors": lambda t, h: torch.broadcast_tensors(t, h),
    "broadcast_tensors, reversed": lambda t, h: torch.broadcast_tensors(h, t),
    "meshgrid": lambda t, h: torch.meshgrid(t, h, indexing="ij"),
    "atleast_1d": lambda t, h: torch.atleast_1d(t, h),
    "atleast_2d": lambda t, h: torch.atleast_2d(h, t),
    "Normal(h).entropy()": lambda t, h: torch.distributions.Normal(
        t, 1.0, validate_args=False
    ).entropy(),
}


@pytest.mark.parametrize("scheduler", SCHEDULERS)
@pytest.mark.parametrize("name", list(LENDERS))
def test_an_output_requires_grad_where_its_own_input_does(name: str, scheduler: Scheduler) -> None:
    """Every lazy input counted: ``t.view_as(h)`` with ``h`` needing grad required grad where
    eagerly it does not, and code branching on it computed other numbers."""
    lin = nn.Linear(3, 3).double()
    op = LENDERS[name]

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        t = torch.as_tensor(x)
        h = lin(t)
        outs = op(t, h)
        outs = outs if isinstance(outs, tuple) else (outs,)
        return (*(o * (10 if o.requires_grad else 1) for o in outs), h)

    assert_matches_eager(fn, _inputs(4), lin, scheduler)


def test_a_hook_on_a_value_of_shared_tensors_only_is_each_instances_own() -> None:
    """Such a value is computed once for all instances: three instances' hooks chained on its
    summed gradient (W's gradient 9 times eager's), and ``retain_grad`` kept none. A hook now
    takes the value out of the memo (each later instance computes its own, as eagerly); one
    on a value several instances already got is refused."""
    w = nn.Parameter(torch.randn(3, dtype=torch.float64))

    def hooked(x: torch.Tensor) -> torch.Tensor:
        h = w * 2
        h.register_hook(lambda g: g * 3)
        return (h * torch.as_tensor(x)).sum()

    held: list[torch.Tensor] = []

    def retained(x: torch.Tensor) -> torch.Tensor:
        h = w * 2
        h.retain_grad()
        held.append(h)
        return (h * torch.as_tensor(x)).sum()

    items = [torch.randn(3, dtype=torch.float64) for _ in range(3)]
    w.grad = None
    torch.stack([hooked(x) for x in items]).sum().backward()
    want = w.grad.clone() if w.grad is not None else None
    w.grad = None
    torch.stack(bf.batch_map(hooked, items)).sum().backward()
    assert want is not None and w.grad is not None
    torch.testing.assert_close(w.grad, want, rtol=0, atol=1e-12)
    torch.stack(bf.batch_map(retained, items)).sum().backward()
    for h, x in zip(held, items, strict=True):
        assert h.grad is not None
        torch.testing.assert_close(h.grad, x, rtol=0, atol=1e-12)

    def late(x: torch.Tensor) -> torch.Tensor:
        h = w * 2  # instance 1 gets instance 0's value: handed twice, then hooked
        if float(x[0]) > 100:
            h.register_hook(lambda g: g * 3)
        return (h * torch.as_tensor(x)).sum()

    with pytest.raises(UnsupportedOpError, match="computed from shared tensors only"):
        bf.batch_map(
            late,
            [torch.zeros(3, dtype=torch.float64), torch.full((3,), 200.0, dtype=torch.float64)],
        )


def test_a_backward_pass_of_shared_tensors_only_inside_runs_as_eagerly() -> None:
    """The second instance's backward met the memoised graph the first one freed."""
    w = nn.Parameter(torch.randn(3, 3, dtype=torch.float64))

    def fn(x: torch.Tensor) -> torch.Tensor:
        (g,) = torch.autograd.grad((w * 2).sum(), w)
        (w**2).sum().backward()
        return g.sum() * torch.as_tensor(x)

    items = [torch.randn(3, dtype=torch.float64) for _ in range(3)]
    w.grad = None
    want = [fn(x) for x in items]
    eager_grad = w.grad.clone() if w.grad is not None else None
    w.grad = None
    got = bf.batch_map(fn, items)
    for g, e in zip(got, want, strict=True):
        torch.testing.assert_close(g, e, rtol=0, atol=1e-12)
    assert eager_grad is not None and w.grad is not None
    torch.testing.assert_close(w.grad, eager_grad, rtol=0, atol=1e-12)
