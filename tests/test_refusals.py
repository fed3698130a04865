"""Autograd features recorded code cannot have, and per-instance reseeding, are refused.

Each refusal names the file and line and the way to write it (see ``batchfold.lazy.refusals``);
the ways the messages give work and equal eager PyTorch.
"""

from __future__ import annotations

import warnings
from collections import namedtuple
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import batchfold as bf
from batchfold.errors import UnsupportedOpError
from batchfold.lazy import refusals
from reference import assert_matches_eager

LIN = nn.Linear(3, 3).double()


def _inputs(n: int) -> list[torch.Tensor]:
    torch.manual_seed(n)
    return [torch.randn(3, dtype=torch.float64) for _ in range(n)]


def _hidden(x: torch.Tensor) -> Any:
    return LIN(torch.as_tensor(x))


class _Cube(torch.autograd.Function):
    """x ** 3 with a deliberately different backward (a straight-through gradient)."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x * x * x

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return grad


class _Times(torch.autograd.Function):
    """x @ w, saving both for a backward that gives w alone a (wrong) gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(x, w)
        ctx.mark_non_differentiable()
        return x @ w

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:  # type: ignore[override]
        return None, torch.ones_like(ctx.saved_tensors[1])


class _Halve(torch.autograd.Function):
    """x / 2, in the form with ``setup_context``."""

    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x / 2

    @staticmethod
    def setup_context(ctx: Any, inputs: Any, output: Any) -> None:
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return grad


_Pair = namedtuple("_Pair", "first second")


def _seeded_dropout(x: torch.Tensor) -> Any:
    torch.manual_seed(0)
    return F.dropout(_hidden(x), 0.5)


def _reseeded(x: torch.Tensor) -> Any:
    torch.set_rng_state(torch.get_rng_state())
    return _hidden(x)


with warnings.catch_warnings():  # its first use scripts functions: torch.jit is deprecated
    warnings.simplefilter("ignore", DeprecationWarning)
    import torch.autograd.forward_ad as fwad

    with fwad.dual_level():
        fwad.make_dual(torch.zeros(1), torch.zeros(1))


def _dual(x: torch.Tensor) -> Any:
    with fwad.dual_level():
        h = fwad.make_dual(torch.as_tensor(x), torch.ones(3, dtype=torch.float64))
        return fwad.unpack_dual(torch.tanh(h)).tangent


CASES: list[tuple[str, Callable[[torch.Tensor], Any], str]] = [
    ("backward", lambda x: _hidden(x).sum().backward(), r"backward of a lazy tensor at"),
    ("hook", lambda x: _hidden(x).register_hook(lambda g: g), r"register_hook of a lazy"),
    ("retain_grad", lambda x: _hidden(x).retain_grad(), r"retain_grad of a lazy"),
    ("grad", lambda x: _hidden(x).grad, r"grad of a lazy tensor at"),
    ("grad_fn", lambda x: _hidden(x).grad_fn, r"grad_fn of a lazy"),
    ("is_leaf", lambda x: _hidden(x).is_leaf, r"is_leaf of a lazy"),
    ("data", lambda x: _hidden(x).data, r"data of a lazy tensor at .*use detach\(\)"),
    # an AttributeError of the Lazy class ("property has no setter") once
    ("data set", lambda x: setattr(_hidden(x), "data", LIN.weight[0]), r"data of a lazy .*rebind"),
    ("grad set", lambda x: setattr(_hidden(x), "grad", LIN.weight[0]), r"grad of a lazy tensor"),
    (
        "requires_grad_",
        lambda x: torch.as_tensor(x).clone().requires_grad_(),
        r"requires_grad_ of a lazy.*torch.as_tensor",
    ),
    (
        "autograd.grad",
        lambda x: torch.autograd.grad(_hidden(x).sum(), LIN.weight),
        r"grad at .* on lazy tensors",
    ),
    ("Function", lambda x: _Cube.apply(_hidden(x)), r"_Cube.apply at .*bf.function"),
    ("named tuple", lambda x: torch.cat(_Pair(_hidden(x), _hidden(x))), r"cat at .*named tuple"),
    ("own memory", lambda x: torch.as_tensor(x).add_(1.0), r"add_\(\) at .*own tensor"),
    ("own memory, a view", lambda x: torch.as_tensor(x)[1:].mul_(2.0), r"mul_\(\) at .*own"),
    ("manual_seed", _seeded_dropout, r"torch.manual_seed\(\) at .*Seed once before"),
    ("set_rng_state", _reseeded, r"torch.set_rng_state\(\) at "),
    # eagerly y stops requiring grad, so a loss on it sends no gradient into LIN; recorded as
    # a write, it kept its history (a silently different gradient)
    ("detach_", lambda x: _hidden(x).detach_() * 2, r"detach_ of a lazy.*x = x.detach\(\)"),
    # valid eagerly: each once met a ShapeError that called the code wrong
    ("unsqueeze_", lambda x: _hidden(x).unsqueeze_(0), r"unsqueeze_\(\) at .*shape in place"),
    ("t_", lambda x: _hidden(x).view(1, 3).t_(), r"t_\(\) at .*rebind it instead"),
    # the batched ops ran after the dual level was left: a tangent of None, or PyTorch's error
    ("forward AD", _dual, r"_make_dual at .*forward-mode AD inside batch_map"),
    # a leaf made from a lazy tensor: it came back without the flag
    (
        "tensor of a lazy, requires_grad",
        lambda x: torch.tensor(_hidden(x), requires_grad=True),
        r"tensor\(\.\.\., requires_grad=True\) of a lazy tensor at",
    ),
    # a layout the batched rows do not have: it crashed in the batching rule
    (
        "channels_last",
        lambda x: _hidden(x).view(1, 3, 1, 1).contiguous(memory_format=torch.channels_last),
        r"contiguous\(memory_format=torch.channels_last\) of a per-instance value at",
    ),
]


@pytest.mark.parametrize(("name", "fn", "message"), CASES, ids=[c[0] for c in CASES])
def test_refused_with_the_line_and_the_way(
    name: str, fn: Callable[[torch.Tensor], Any], message: str
) -> None:
    with pytest.raises(UnsupportedOpError, match=message) as caught:
        bf.batch_map(fn, _inputs(2))
    assert "test_refusals.py:" in str(caught.value)


def test_seeding_and_functions_outside_batch_map_are_untouched() -> None:
    torch.manual_seed(3)
    first = torch.rand(2)
    torch.manual_seed(3)
    assert torch.equal(first, torch.rand(2))
    x = torch.ones(2, requires_grad=True)
    _Cube.apply(x).sum().backward()
    assert x.grad is not None and torch.equal(x.grad, torch.ones(2))  # its own backward
    # what is there before (PyTorch wraps torch.manual_seed once torch._dynamo is imported)
    seeding = [getattr(space, name) for space, name, _ in refusals._SEEDING]
    bf.batch_map(lambda v: torch.as_tensor(v) * 2, _inputs(2))  # patches, then puts back
    assert torch.autograd.Function.__dict__["apply"] is refusals.ORIGINAL_APPLY
    assert torch.amp.autocast_mode.autocast.__enter__ is refusals.ORIGINAL_ENTER
    assert [getattr(space, name) for space, name, _ in refusals._SEEDING] == seeding


def test_a_custom_function_in_a_batched_function_keeps_its_backward() -> None:
    cube = bf.function(_Cube.apply, batched=True)
    assert_matches_eager(lambda x: cube(_hidden(x)), _inputs(4), LIN)


def test_a_custom_function_where_its_backward_cannot_matter_records() -> None:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = _hidden(x)
        with torch.no_grad():
            quiet = _Cube.apply(h)  # outside grad mode
        return quiet, _Cube.apply(torch.as_tensor(x)), h  # ... and on a tensor without grad

    assert_matches_eager(fn, _inputs(4), LIN)


def test_a_custom_function_on_a_weight_that_requires_grad_is_refused() -> None:
    """Only lazy arguments were checked: the weight's gradient (from the Function's own
    backward eagerly) was lost without a word, and the result did not require grad."""
    weight = torch.nn.Parameter(torch.randn(3, 4, dtype=torch.float64))
    with pytest.raises(bf.UnsupportedOpError, match=r"_Times.apply at .*requires grad"):
        bf.batch_map(lambda x: _Times.apply(torch.as_tensor(x), weight), _inputs(3))


def test_a_custom_function_that_saves_lazy_values_runs_where_no_gradient_flows() -> None:
    """``save_for_backward`` of a lazy value met PyTorch's TypeError inside batch_map."""
    weight = torch.randn(3, 4, dtype=torch.float64)

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        t = torch.as_tensor(x)
        return _Times.apply(t, weight), _Halve.apply(t)

    assert_matches_eager(fn, _inputs(4))
    with torch.no_grad():
        hidden = lambda x: _Times.apply(_hidden(x), weight)  # noqa: E731
        got, want = bf.batch_map(hidden, _inputs(3)), [hidden(x) for x in _inputs(3)]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
        assert not g.requires_grad and not w.requires_grad


def test_writes_into_copies_of_an_instances_tensor_record() -> None:
    shared = torch.ones(3, dtype=torch.float64)  # one tensor in every instance, as eagerly

    def fn(x: Any) -> torch.Tensor:
        a, b = torch.as_tensor(x).clone(), torch.as_tensor(x, dtype=torch.float32)
        a.add_(1.0)
        b.mul_(2.0)  # a cast is a copy too
        return _hidden(a) + b.double()

    got = bf.batch_map(fn, [shared, shared, np.ones(3)])
    assert torch.equal(shared, torch.ones(3, dtype=torch.float64))
    for g in got:
        torch.testing.assert_close(g, fn(shared))


def test_an_instances_tensor_changed_after_as_tensor_read_it_is_refused() -> None:
    def fn(x: torch.Tensor) -> Any:
        doubled = torch.as_tensor(x) * 2  # eagerly computed now, from the old values
        x.add_(1.0)  # the instance's own tensor, changed in place
        return doubled

    with pytest.raises(UnsupportedOpError, match=r"tensor .* changed in place inside the"):
        bf.batch_map(fn, _inputs(2))


def test_an_instances_array_changed_after_as_tensor_read_it_is_refused() -> None:
    """Eagerly the tensor shares the array's memory: ops before the change see the old
    values, ops after it the new ones (a copy read when the batch runs gave the old ones to
    all). NumPy memory has no version, so the copy is compared with the array at the run."""

    def before(x: np.ndarray) -> Any:
        doubled = torch.as_tensor(x) * 2
        x += 1.0
        return doubled

    def after(x: np.ndarray) -> Any:
        t = torch.as_tensor(x)
        x += 1.0
        return t * 2  # eagerly the new values

    def asarray(x: np.ndarray) -> Any:  # torch.asarray shares too: it was memoised by id
        doubled = torch.asarray(x) * 2
        x += 1.0
        return doubled

    for fn in (before, after, asarray):
        with pytest.raises(UnsupportedOpError, match=r"NumPy array .* was changed inside"):
            bf.batch_map(fn, [np.ones(3), np.zeros(3)])
    for read in (torch.as_tensor, torch.asarray):
        unchanged = bf.batch_map(lambda x, read=read: read(x) * 2, [np.ones(3)])
        torch.testing.assert_close(unchanged[0], torch.full((3,), 2.0, dtype=torch.float64))


def test_an_instances_memory_changed_after_a_sync_point_is_refused() -> None:
    """A run at a sync point read the memory while it was unchanged; a change after it, then
    a use of the tensor (or the tensor returned as it is), once gave the old values where
    eagerly the tensor is the changed memory."""

    def tensor_then_use(x: torch.Tensor) -> Any:
        t = torch.as_tensor(x)
        float(t.sum())  # a sync point: the batch so far runs
        x.add_(1.0)
        return t * 1

    def array_returned(x: np.ndarray) -> Any:
        t = torch.as_tensor(x)
        float(t.sum())
        x += 1.0
        return t

    cases = [
        (tensor_then_use, [torch.ones(2), torch.zeros(2)], "tensor"),
        (array_returned, [np.ones(2), np.zeros(2)], "NumPy array"),
    ]
    for fn, inputs, what in cases:
        with pytest.raises(UnsupportedOpError, match=rf"{what} .* changed .*inside the function"):
            bf.batch_map(fn, inputs)


def test_writes_into_a_cast_of_an_instances_tensor_record() -> None:
    def fn(x: torch.Tensor) -> Any:
        y = torch.as_tensor(x).float()  # float64 to float32: a copy
        y.add_(1.0)
        return y

    got = bf.batch_map(fn, _inputs(2))
    for g, x in zip(got, _inputs(2), strict=True):
        torch.testing.assert_close(g, x.float() + 1.0)


def test_leaves_passed_in_the_instances_get_their_gradients() -> None:
    leaves = [x.requires_grad_() for x in _inputs(3)]
    out = bf.batch_map(lambda a: _hidden(a).pow(2).sum(), leaves)
    got = torch.autograd.grad(torch.stack(out).sum(), leaves)
    want = torch.autograd.grad(torch.stack([_hidden(a).pow(2).sum() for a in leaves]).sum(), leaves)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("cache_modules", [True, False])
def test_a_lazy_module_not_made_yet_is_refused_with_the_way_out(cache_modules: bool) -> None:
    """Its first call made its parameters from a lazy value, and PyTorch raised from deep
    inside (an uninitialized parameter's dim()); made by a call outside, it runs."""
    layer = nn.LazyLinear(2)
    xs = [torch.randn(3, 4) for _ in range(2)]
    with pytest.raises(UnsupportedOpError, match="LazyLinear at .* not made yet"):
        bf.batch_map(lambda x: layer(torch.as_tensor(x)), xs, cache_modules=cache_modules)
    layer(xs[0])  # a dry run makes the parameters
    got = bf.batch_map(lambda x: layer(torch.as_tensor(x)), xs, cache_modules=cache_modules)
    for g, x in zip(got, xs, strict=True):
        torch.testing.assert_close(g, layer(x))


def test_a_distribution_validating_a_lazy_value_names_the_way_out() -> None:
    """Its ``isinstance(value, torch.Tensor)`` check raised "must be a Tensor"; without
    validation the same code equals eager."""
    torch.manual_seed(0)
    head = nn.Linear(4, 3)
    xs = [torch.randn(4) for _ in range(3)]

    def log_prob(x: torch.Tensor, validate: bool) -> torch.Tensor:
        dist = torch.distributions.Categorical(
            logits=head(torch.as_tensor(x)), validate_args=validate
        )
        return dist.log_prob(torch.tensor(1))

    with pytest.raises(UnsupportedOpError, match="Categorical at .* validate_args=False"):
        bf.batch_map(lambda x: log_prob(x, True), xs)
    got = bf.batch_map(lambda x: log_prob(x, False), xs)
    for g, x in zip(got, xs, strict=True):
        torch.testing.assert_close(g, log_prob(x, True))
    assert torch.distributions.Distribution._validate_sample.__name__ == "_validate_sample"


def test_a_lazy_module_first_called_on_a_tensor_from_outside_runs_as_eagerly() -> None:
    """The call makes its parameters, as eagerly (PyTorch raised from deep inside: the
    parameters were being made as per-instance constants)."""
    torch.manual_seed(0)
    layer = nn.LazyLinear(2)
    shared = torch.randn(3, 4)
    xs = [torch.randn(3, 2) for _ in range(2)]
    got = bf.batch_map(lambda x: layer(shared) + torch.as_tensor(x), xs)
    for g, x in zip(got, xs, strict=True):
        torch.testing.assert_close(g, layer(shared) + x)


def test_a_users_own_validate_sample_comes_back_after_the_run() -> None:
    dist = torch.distributions.Distribution
    before = dist.__dict__["_validate_sample"]

    def mine(self: Any, value: Any) -> None:
        return before(self, value)

    dist._validate_sample = mine  # type: ignore[method-assign]
    try:
        bf.batch_map(lambda x: torch.as_tensor(x) * 2, [torch.ones(2)])
        assert dist.__dict__["_validate_sample"] is mine
    finally:
        dist._validate_sample = before  # type: ignore[method-assign]


def test_the_function_form_of_detach_in_place_is_refused_too() -> None:
    """``torch.detach_(h)`` was recorded as a write that kept h's history (the method form
    was refused): results required grad and gradients reached the layer, as eagerly not."""
    layer = nn.Linear(3, 3)
    with pytest.raises(UnsupportedOpError, match="detach_ of a lazy tensor"):
        bf.batch_map(lambda x: torch.detach_(layer(torch.as_tensor(x))), [torch.randn(3)])


def test_embedding_scaling_gradients_by_frequency_is_refused_where_it_would_train() -> None:
    """The counts are per call: batched, the lookups of every instance are one call, so the
    gradients would follow the batch (silently, before the refusal). Without gradients the
    option changes nothing, and the lookups batch."""
    table = nn.Embedding(10, 3, scale_grad_by_freq=True)
    words = [[1, 2, 2], [2, 5], [1]]
    with pytest.raises(bf.UnsupportedOpError, match="scale_grad_by_freq divides"):
        bf.batch_map(lambda w: table(torch.tensor(w)), words)
    with pytest.raises(bf.UnsupportedOpError, match="scale_grad_by_freq divides"):
        bf.batch_map(lambda w: table(torch.tensor(w[0])), words)  # a module cached per word
    with torch.no_grad():
        got = bf.batch_map(lambda w: table(torch.tensor(w)), words)
        for w, g in zip(words, got, strict=True):
            torch.testing.assert_close(g, table(torch.tensor(w)))


def _changes_through_data() -> dict[str, Callable[[nn.Linear], Any]]:
    ones = torch.ones(3, 3)
    return {
        "data assigned": lambda layer: setattr(layer.weight, "data", ones.clone()),
        "data written": lambda layer: layer.weight.data.mul_(3.0),
        "data item assigned": lambda layer: layer.weight.data.__setitem__(0, 1.0),
        "data copied into": lambda layer: layer.weight.data.copy_(ones),
        "frozen": lambda layer: layer.requires_grad_(False),  # earlier calls lose their grads
        "requires_grad set": lambda layer: setattr(layer.bias, "requires_grad", False),
    }


@pytest.mark.parametrize("change", list(_changes_through_data()))
def test_a_shared_tensor_changed_unversioned_while_its_readers_wait_is_refused(
    change: str,
) -> None:
    """``t.data = x``, writes through ``t.data`` and changes of ``requires_grad`` leave ``t``'s
    version as it was, so the calls recorded before the change ran later on the new values,
    or without ``t``'s gradient (silently)."""
    torch.manual_seed(0)
    layer = nn.Linear(3, 3)
    write = _changes_through_data()[change]  # its tensors made outside: shared

    def fn(x: list[float]) -> Any:
        h = torch.tensor(x)
        before = layer(h)
        write(layer)
        return before, layer(h)

    with pytest.raises(UnsupportedOpError, match="was changed in place .*before batch_map ran"):
        bf.batch_map(fn, [[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]])


def test_reading_a_shared_tensors_data_batches_as_the_tensor() -> None:
    layer = nn.Linear(3, 3)

    def fn(x: list[float]) -> Any:
        return torch.tanh(torch.tensor(x) @ layer.weight.data.T)

    xs = [[1.0, 2.0, 3.0], [0.5, -1.0, 2.0], [0.0, 1.0, 1.0]]
    got, stats = bf.batch_map(fn, xs, return_stats=True)
    assert stats.steps <= 3 and not got[0].requires_grad  # one matmul for every instance
    for x, g in zip(xs, got, strict=True):
        torch.testing.assert_close(g, fn(x))


def _backward_hooks() -> dict[str, Callable[[nn.Module], Any]]:
    def seen(*_: Any) -> None:
        return None

    return {
        "full": lambda m: m.register_full_backward_hook(seen),
        "full pre": lambda m: m.register_full_backward_pre_hook(seen),
        "every module": lambda m: nn.modules.module.register_module_full_backward_hook(seen),
    }


@pytest.mark.parametrize("hook", list(_backward_hooks()))
def test_a_module_with_backward_hooks_is_refused_on_per_instance_values(hook: str) -> None:
    """The hooks never ran (silently): the calls' values are rows of batched tensors."""
    layer = nn.Linear(3, 3)
    handle = _backward_hooks()[hook](layer)
    try:
        with pytest.raises(UnsupportedOpError, match="Linear at .* has backward hooks"):
            bf.batch_map(lambda x: layer(torch.tensor(x)).sum(), [[1.0, 2.0, 3.0]] * 2)
        shared = bf.batch_map(lambda _: layer(layer.weight[0]).sum(), [0, 1])  # runs eagerly
        assert shared[0].requires_grad
        with torch.no_grad():  # eagerly the hooks would not run either: not refused
            assert_matches_eager(lambda x: layer(torch.tensor(x)), [[1.0, 2.0, 3.0]] * 2)
    finally:
        handle.remove()


class _Doubled(nn.Module):
    """Reads a tensor it makes from its weight (``W * 2``) at every call."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.lin.weight * 2.0, self.lin.bias)


@pytest.mark.parametrize("rows", [False, True])
def test_a_weight_changed_between_cached_calls_that_read_a_tensor_made_from_it_is_refused(
    rows: bool,
) -> None:
    """The cached calls after the change read ``W * 2`` made before it (silently stale)."""
    module = _Doubled()

    def fn(item: tuple[list[float], bool]) -> Any:
        x, change = item
        t = torch.tensor([x] * 2) if rows else torch.tensor(x)  # rows: ragged calls
        if change:
            with torch.no_grad():
                module.lin.weight.mul_(1.5)
        return module(t), module(torch.cat([t, t]) if rows else t * 2)  # two lengths: cached

    with pytest.raises(UnsupportedOpError, match="changed in place between calls of _Doubled"):
        bf.batch_map(fn, [([1.0, 2.0, 3.0], False), ([0.5, 1.0, 2.0], True)])


def test_torch_embedding_is_read_by_its_own_argument_order() -> None:
    """``torch.embedding(weight, indices, padding_idx, scale_grad_by_freq)`` is not
    ``F.embedding(indices, weight, padding_idx, max_norm, ...)``: read by the latter's order,
    scale_grad_by_freq went unseen (a silently different gradient) and a fourth argument of
    False was refused as a max_norm."""
    weight = nn.Parameter(torch.randn(5, 3))
    words = [[1, 2, 2], [2, 3, 3]]
    for refused in (
        lambda w: torch.embedding(weight, torch.tensor(w), scale_grad_by_freq=True),
        lambda w: torch.embedding(weight, torch.tensor(w), -1, True),
    ):
        with pytest.raises(UnsupportedOpError, match="scale_grad_by_freq divides"):
            bf.batch_map(refused, words)
    assert_matches_eager(lambda w: torch.embedding(weight, torch.tensor(w), -1, False), words)


def test_setting_requires_grad_to_what_it_is_counts_as_no_change() -> None:
    """Freezing a layer at the start of every instance changes it once, before anything reads
    it: the calls run as eagerly (the flag set again to its value was refused once)."""
    encoder, head = nn.Linear(3, 3), nn.Linear(3, 2)

    def fn(x: list[float]) -> torch.Tensor:
        encoder.requires_grad_(False)
        head.weight.requires_grad = True
        return head(encoder(torch.tensor(x)))

    xs = [[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]]
    assert_matches_eager(fn, xs, head)
    assert not any(p.requires_grad for p in encoder.parameters())


@pytest.mark.parametrize("batched", [False, True])
def test_a_function_that_writes_into_its_arguments_is_refused(batched: bool) -> None:
    """Its batched call runs later: the write reached other instances' values, or none,
    depending on the plan (silently)."""
    doubled = bf.function(lambda h: h.mul_(2), batched=batched)

    def fn(x: list[float]) -> Any:
        h = torch.tensor(x) * 1
        before = h + 0
        doubled(h)
        return before, h + 0

    with pytest.raises(UnsupportedOpError, match="writes into its arguments in place"):
        bf.batch_map(fn, [[1.0, 1.0], [2.0, 2.0]])


def test_a_batched_function_given_a_tensor_from_outside_is_refused() -> None:
    """Called on one instance, a ``batched=True`` function gives every argument a batch
    dimension, the weight's too; inside batch_map the weight came without one (here ``w[0]``
    was its first row, not the weight: silently)."""
    weight = nn.Parameter(torch.randn(4, 4))
    add_first_row = bf.function(lambda h, w: h + w[0], batched=True)
    with pytest.raises(UnsupportedOpError, match="batched=True, gets a tensor from outside"):
        bf.batch_map(lambda x: add_first_row(torch.tensor(x), weight), [[1.0] * 4, [2.0] * 4])


def test_a_module_member_set_to_a_per_instance_value_is_refused() -> None:
    """``functional_call`` with per-instance parameters (and ``register_buffer`` of one) failed
    with PyTorch's ``TypeError`` on the lazy value; the refusal says what to do instead."""
    from torch.func import functional_call

    layer, holder = nn.Linear(3, 2), nn.Module()
    ones = torch.ones(3)
    with pytest.raises(UnsupportedOpError, match="swap_tensor of Linear with a per-instance"):
        bf.batch_map(
            lambda x: functional_call(layer, {"weight": torch.tensor(x).view(2, 3)}, (ones,)),
            [[1.0] * 6, [0.0] * 6],
        )
    with pytest.raises(UnsupportedOpError, match="register_buffer of Module with a per-instance"):
        bf.batch_map(lambda x: holder.register_buffer("b", torch.tensor(x)), [[1.0], [2.0]])


def test_a_write_pytorchs_own_code_makes_names_that_code() -> None:
    """``Gamma.rsample`` clamps a detached view in place: the refusal read as if the user's
    line wrote ``clamp_()``."""
    lin = nn.Linear(3, 3).double()

    def fn(x: torch.Tensor) -> Any:
        rate = torch.exp(lin(torch.as_tensor(x)))
        return torch.distributions.Gamma(rate, 1.0, validate_args=False).rsample()

    with pytest.raises(
        bf.UnsupportedOpError, match=r"clamp_\(\) \(inside PyTorch's torch/distributions/gamma.py"
    ):
        bf.batch_map(fn, _inputs(2))

    def own(x: torch.Tensor) -> Any:
        t = torch.as_tensor(x) * 1
        return t[0:2].mul_(2) + t[1]

    with pytest.raises(bf.UnsupportedOpError, match="writes into a view") as caught:
        bf.batch_map(own, _inputs(2))
    assert "inside PyTorch" not in str(caught.value)  # the user's own write


@pytest.mark.parametrize("loss", [F.cross_entropy, F.nll_loss])
def test_a_class_weight_that_requires_grad_is_refused_as_eagerly(loss: Callable[..., Any]) -> None:
    # a batched loss made a gradient for the weight, where eager PyTorch raises
    weight = nn.Parameter(torch.tensor([0.5, 2.0, 1.0], dtype=torch.float64))
    items = [(torch.randn(n, 3, dtype=torch.float64), torch.tensor([0, 2, 1][:n])) for n in (2, 3)]

    def fn(item: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return loss(torch.as_tensor(item[0]), torch.as_tensor(item[1]), weight=weight)

    with pytest.raises(RuntimeError, match="not differentiable"):
        fn(items[0])
    with pytest.raises(RuntimeError, match="test_refusals.py.*class weight that requires grad"):
        bf.batch_map(fn, items)
    with torch.no_grad():  # outside grad mode eager takes it, and so does batch_map
        for got, x in zip(bf.batch_map(fn, items), items, strict=True):
            torch.testing.assert_close(got, fn(x))


def test_a_write_into_an_outside_tensor_after_a_sync_point_is_refused() -> None:
    # instance 1's product ran at the sync, before instance 0's write: eagerly it comes
    # after it (instance 0 runs whole first), so it gave [-1, -1] for eager's [-2, -2]
    w = torch.ones(2)

    def fn(x: torch.Tensor) -> Any:
        h = torch.as_tensor(x) * w
        if h.sum().item() > 0:
            with torch.no_grad():
                w.add_(1.0)
        return h

    with pytest.raises(UnsupportedOpError, match=r"add_ at .*test_refusals.py.*after a sync"):
        bf.batch_map(fn, [torch.ones(2), -torch.ones(2)])
