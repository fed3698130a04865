"""``torch.as_tensor`` and ``torch.asarray`` of a lazy value inside ``batch_map`` do what they do
eagerly: without a conversion they return the value itself, so a write through the result
changes it; with one they copy. Each case once gave a silently different number (a copy
where eager PyTorch aliases), or a ``requires_grad`` other than eager's.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import types
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import batchfold as bf
from batchfold.errors import UnsupportedOpError
from batchfold.lazy.writes import index_copies
from reference import assert_matches_eager

SCHEDULERS = ["agenda", "depth"]
INSTANCES = [[1.0, -2.0, 3.0], [0.5, 0.0, -1.0], [2.0, 2.0, -3.0]]
pytestmark = [
    pytest.mark.usefixtures("float64"),
    pytest.mark.filterwarnings("ignore:torch.asarray. unspecified requires_grad"),
]


def _cases(layer: nn.Module) -> dict[str, Any]:
    def computed(x: list[float]) -> torch.Tensor:
        return layer(torch.tensor(x)).clone()

    def as_tensor_write(x: list[float]) -> Any:
        y = computed(x)
        torch.as_tensor(y).mul_(2)  # eager: y itself doubles
        return y

    def asarray_write(x: list[float]) -> Any:
        y = computed(x)
        torch.asarray(y, copy=False).add_(1)
        return y

    def same_dtype_and_device(x: list[float]) -> Any:
        y = computed(x)
        torch.as_tensor(y, dtype=torch.float64, device="cpu").sub_(3)
        return y

    def instance_tensor(x: list[float]) -> Any:
        t = torch.tensor(x)
        torch.as_tensor(t).mul_(t)  # a tensor the instance made: squared in place
        return layer(t)

    def converting(x: list[float]) -> Any:
        y = computed(x)
        z = torch.as_tensor(y, dtype=torch.float32)
        z.mul_(2)  # a copy: y stays
        return y, z

    def copying(x: list[float]) -> Any:
        y = computed(x)
        torch.asarray(y, copy=True).mul_(2)  # a copy: y stays
        return y

    def detached(x: list[float]) -> Any:
        y = computed(x)
        return torch.asarray(y, requires_grad=False), y  # the first without grad, as eager

    def grad_kept(x: list[float]) -> Any:
        return torch.asarray(computed(x), requires_grad=True) * 2  # requires grad already

    return {
        "as_tensor_write": as_tensor_write,
        "asarray_write": asarray_write,
        "same_dtype_and_device": same_dtype_and_device,
        "instance_tensor": instance_tensor,
        "converting": converting,
        "copying": copying,
        "detached": detached,
        "grad_kept": grad_kept,
    }


@pytest.mark.parametrize("name", list(_cases(nn.Identity())))
@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_as_tensor_of_a_lazy_value_aliases_or_copies_as_eager(name: str, scheduler: str) -> None:
    torch.manual_seed(0)
    layer = nn.Linear(3, 3)
    assert_matches_eager(_cases(layer)[name], INSTANCES, layer, scheduler)  # type: ignore[arg-type]


def test_as_tensor_returns_the_lazy_value_itself() -> None:
    def same(x: list[float]) -> Any:
        t = torch.tensor(x)
        return torch.as_tensor(t) is t and torch.asarray(t) is t

    assert bf.batch_map(same, INSTANCES) == [True] * len(INSTANCES)


def test_a_leaf_made_with_asarray_requires_grad_is_refused() -> None:
    def leaf(x: list[float]) -> Any:
        return torch.asarray(torch.tensor(x), requires_grad=True) * 2

    assert leaf(INSTANCES[0]).requires_grad  # eagerly a new leaf: no leaf of its own inside
    with pytest.raises(UnsupportedOpError, match="not a leaf of its own"):
        bf.batch_map(leaf, INSTANCES)


def _returns_input(t: torch.Tensor) -> dict[str, Any]:
    """Calls that eager PyTorch answers with ``t`` itself, or a view of it, for a real
    ``[2, 3]`` ``t`` on the CPU (checked by the test below, so the list cannot go stale)."""
    return {
        "cpu": t.cpu(),
        "positive": torch.positive(t),
        "unary plus": +t,
        "conj": t.conj(),
        "resolve_conj": t.resolve_conj(),
        "resolve_neg": t.resolve_neg(),
        "adjoint": t.adjoint(),
        "mH": t.mH,
        "H": t.H,
        "real": t.real,
        "atleast_1d": torch.atleast_1d(t),
        "atleast_2d": torch.atleast_2d(t),
        "atleast_3d": torch.atleast_3d(t),
        "sum_to_size": t.sum_to_size(2, 3),
        "to_dense": t.to_dense(),
        "dropout1d in eval": torch.nn.functional.dropout1d(t, 0.5, training=False),
        "dropout2d with p 0": torch.nn.functional.dropout2d(t[None, None], 0.0),
        "broadcast_tensors": torch.broadcast_tensors(t)[0],
        "einsum": torch.einsum("ij->ji", t),
    }


def test_the_calls_listed_return_their_input_eagerly() -> None:
    t = torch.randn(2, 3)
    for name, out in _returns_input(t).items():
        assert out.untyped_storage().data_ptr() == t.untyped_storage().data_ptr(), name


@pytest.mark.parametrize("name", list(_returns_input(torch.zeros(2, 3))))
def test_a_write_through_a_call_that_returns_its_input_is_seen_or_refused(name: str) -> None:
    """Eagerly the write changes the input too; batched it must do the same or be refused
    (each of these once gave the input unchanged, silently)."""
    torch.manual_seed(0)
    layer = nn.Linear(6, 6)

    def write(x: list[float]) -> Any:
        y = layer(torch.tensor(x)).view(2, 3)
        _returns_input(y)[name].mul_(2)
        return y

    instances = [[float(i + k) for i in range(6)] for k in range(3)]
    try:
        assert_matches_eager(write, instances, layer)
    except UnsupportedOpError as error:
        assert "writes into a view" in str(error)


def test_a_write_into_the_second_argument_of_broadcast_tensors_is_refused() -> None:
    def write(x: list[float]) -> Any:
        a, b = torch.tensor(x), torch.tensor(x[:1])
        _, b_wide = torch.broadcast_tensors(a, b)
        b.add_(1)  # eagerly b_wide sees it
        return b_wide

    with pytest.raises(UnsupportedOpError, match="view"):
        bf.batch_map(write, INSTANCES)


class _ViewOfSecond(nn.Module):
    """Returns a view of its second argument, directly or through a chain of views."""

    def __init__(self, chain: bool) -> None:
        super().__init__()
        self.chain = chain

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> Any:
        return (a * 2, b.view(2, 2).t()[0]) if self.chain else b.view(2, 2)


@pytest.mark.parametrize("chain", [False, True])
def test_a_module_returning_a_view_of_any_argument_is_not_cached(chain: bool) -> None:
    """Once cached, such a call's output would not be marked as a view of the argument, and
    a later write into the argument would not reach it (both cases once did, silently)."""
    module = _ViewOfSecond(chain)

    def calls(x: list[float]) -> Any:
        b = torch.tensor(x)
        for k in range(3):  # the third call is where a confirmed entry would be hit
            module(torch.tensor(x), b + k)
        return b

    _, stats = bf.batch_map(calls, [[1.0, 2.0, 3.0, 4.0]], return_stats=True)
    assert stats.module_calls_cached == 0
    assert stats.module_misses == {"_ViewOfSecond: returns a view of an argument": 3}

    with pytest.raises(UnsupportedOpError, match="view of it"):
        bf.batch_map(_written_after_cached_calls(module), [[1.0, 2.0, 3.0, 4.0]])


def _written_after_cached_calls(module: nn.Module) -> Callable[[list[float]], Any]:
    """Calls ``module(a, b)`` until a cacheable call would be cached, then writes into ``b``
    after a last call: eagerly its output sees the write where it views ``b``."""

    def fn(x: list[float]) -> Any:
        b = torch.tensor(x)
        for k in range(2):
            module(torch.tensor(x), b + k)
        out = module(torch.tensor(x), b)
        b.mul_(3)
        return out

    return fn


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_a_first_call_with_one_value_twice_is_no_template_for_later_calls(scheduler: str) -> None:
    """``h = c = zeros`` makes an LSTM cell's first call get one value for both; its ops then
    read that value for ``c`` too. Two such first calls (two instances) once confirmed that
    as the cached template, and every later call read ``h`` where it meant ``c``."""
    torch.manual_seed(0)
    cell = nn.LSTMCell(3, 2)

    def run(x: list[list[float]]) -> Any:
        h = c = torch.zeros(2)
        outs = []
        for row in torch.tensor(x):
            h, c = cell(row, (h, c))
            outs.append(h)
        return outs

    instances = [[[0.5, -1.0, 2.0]], [[1.0, 2.0, 3.0]] * 4, [[-1.0, 0.0, 1.0]] * 2]
    stats = assert_matches_eager(run, instances, cell, scheduler)  # type: ignore[arg-type]
    assert stats.module_calls_cached > 0, "calls with two values are still cached"


class _GradBranch(nn.Module):
    """Computes otherwise when its argument requires grad, which a cache key leaves out."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * (2.0 if x.requires_grad else 3.0)


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_a_module_that_reads_requires_grad_of_an_argument_is_not_cached(scheduler: str) -> None:
    """Two calls on values that require grad once confirmed a template that later calls on
    values that require none (eagerly the other branch) replayed."""
    torch.manual_seed(0)
    module = _GradBranch()

    def calls(x: list[float]) -> Any:
        a = module.lin(torch.tensor(x))
        return [module(a), module(a * 2), module(torch.tensor(x)), module(a.detach())]

    stats = assert_matches_eager(calls, INSTANCES, module, scheduler)  # type: ignore[arg-type]
    assert any("reads requires_grad" in reason for reason in stats.module_misses)


class _Configured(nn.Module):
    """Scales by an attribute of a configuration object it is called with."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor, config: Any) -> torch.Tensor:
        return self.lin(x) * config.scale


@dataclasses.dataclass(frozen=True)
class _Frozen:
    scale: float


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_a_module_called_with_an_object_that_changes_is_not_cached(scheduler: str) -> None:
    """The key holds such an object by identity: two calls confirmed a template that later
    calls replayed with the attribute's old value (a silently different result). An object
    hashed by value (a frozen dataclass) is part of the key, and such calls are cached."""
    torch.manual_seed(0)
    module = _Configured()
    config = types.SimpleNamespace(scale=1.0)

    def calls(x: list[float]) -> Any:
        outs = []
        for k in range(4):
            config.scale = 1.0 if k < 2 else 5.0
            outs.append(module(torch.tensor(x), config))
        return outs

    stats = assert_matches_eager(calls, INSTANCES, module, scheduler)  # type: ignore[arg-type]
    assert any("may change between calls" in reason for reason in stats.module_misses)

    def frozen(x: list[float]) -> Any:
        return [module(torch.tensor(x), _Frozen(1.0 if k < 2 else 5.0)) for k in range(4)]

    stats = assert_matches_eager(frozen, INSTANCES, module, scheduler)  # type: ignore[arg-type]
    assert stats.module_calls_cached > 0 and not stats.module_misses


@pytest.mark.parametrize("batched", [False, True])
def test_a_function_called_with_an_object_that_changes_records_its_ops(batched: bool) -> None:
    """A ``bf.function`` node keeps its arguments until the batch runs: with an object the
    key holds by identity, every call once saw the object's last state."""
    torch.manual_seed(0)
    weight = torch.randn(3, 3)
    config = types.SimpleNamespace(scale=1.0)

    def scaled(x: torch.Tensor, settings: Any) -> torch.Tensor:
        return (x @ weight) * settings.scale

    fn = bf.function(scaled, batched=batched)

    def calls(x: list[float]) -> Any:
        outs = []
        for k in range(3):
            config.scale = k + 1.0
            outs.append(fn(torch.tensor(x), config))
        return outs

    assert_matches_eager(calls, INSTANCES)  # type: ignore[arg-type]


def _advanced_index_writes() -> dict[str, Any]:
    def picked(x: list[float]) -> Any:
        h = torch.tensor(x) * 1
        y = h[[0, 2]]  # a copy eagerly: the write leaves h alone
        y.add_(1)
        return h, y

    mask = torch.tensor([True, False, True])  # shared: the same rows of every instance

    def masked(x: list[float]) -> Any:
        h = torch.tensor(x) * 1
        y = h[mask]  # a copy too
        y.mul_(2)
        return h, y

    def scattered(x: list[float]) -> Any:
        h = torch.tensor(x) * 1
        z = torch.zeros(4)
        z[torch.tensor([3, 0, 1])] += h  # reads z[i] (a copy), adds, writes it back
        return z

    return {"picked": picked, "masked": masked, "scattered": scattered}


@pytest.mark.parametrize("name", list(_advanced_index_writes()))
@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_a_write_into_an_advanced_index_copy_runs_as_eagerly(name: str, scheduler: str) -> None:
    """``x[[0, 2]]``, ``x[mask]`` and ``x[index_tensor]`` are copies eagerly; they were taken
    for views, so a write into them (``z[i] += h``) was refused. ``x[0]`` stays a view."""
    assert_matches_eager(_advanced_index_writes()[name], INSTANCES, None, scheduler)  # type: ignore[arg-type]


def test_a_write_into_a_basic_index_view_is_still_refused() -> None:
    def fn(x: list[float]) -> Any:
        h = torch.tensor(x) * 1
        y = h[0]  # a view eagerly: the write changes h
        y.add_(1)
        return h

    with pytest.raises(UnsupportedOpError, match="view"):
        bf.batch_map(fn, INSTANCES)


@pytest.mark.parametrize(
    "index",
    [np.array(1), (np.array(0), 1), [slice(None), 0], [torch.tensor(0)]],
    ids=["0-d array", "0-d array in a tuple", "list with a slice", "list with a 0-d tensor"],
)
@pytest.mark.filterwarnings("ignore:Using a non-tuple sequence for multidimensional indexing")
def test_indices_that_eagerly_view_are_views(index: Any) -> None:
    """A 0-d integer array selects, and a short list holding a slice or a tensor is read as a
    tuple: views eagerly, so a write through them is refused (it was let through as a copy's,
    and never reached the tensor)."""

    def fn(x: list[float]) -> Any:
        h = torch.tensor([x, x]) * 1
        y = h[index]
        y.add_(100)
        return h

    with pytest.raises(UnsupportedOpError, match="view"):
        bf.batch_map(fn, INSTANCES)


@pytest.mark.filterwarnings("ignore:Using a non-tuple sequence for multidimensional indexing")
def test_no_index_that_views_eagerly_is_taken_for_a_copy() -> None:
    """Every index of one or two parts from a vocabulary of index kinds: where eager's
    ``x[index]`` shares ``x``'s memory, ``index_copies`` must not call it a copy (a write
    through it would then be let through and never reach ``x``)."""
    x = torch.arange(60.0).view(3, 4, 5)
    kinds = [0, -1, slice(None), slice(1, 3), None, Ellipsis, True, [0, 1], [True, False, True]]
    kinds += [[slice(None), 0], [torch.tensor(0)], [[0, 1]], [np.int64(1)], np.int64(1)]
    kinds += [np.array(1), np.array([0, 1]), np.array(True), torch.tensor(1), torch.tensor([0, 2])]
    kinds += [
        torch.tensor(True),
        torch.tensor(1, dtype=torch.int32),
        torch.tensor(1, dtype=torch.uint8),
    ]
    checked = 0
    for n in (1, 2):
        for parts in itertools.product(kinds, repeat=n):
            index = parts if n > 1 else parts[0]
            try:
                y = x[index]
            except (IndexError, TypeError, RuntimeError, ValueError):
                continue
            view = (
                y.numel() > 0 and y.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
            )
            assert not (view and index_copies(index)), f"x[{index!r}] views eagerly"
            checked += 1
    assert checked > 300


def test_a_module_returning_a_bf_function_view_of_an_argument_is_not_cached() -> None:
    """A ``bf.function`` whose code returns a view of an argument marks its output a view of
    every argument; a module returning it was cached all the same, so a later write into the
    argument did not reach the returned value (8.0 off). Now such a module is traced every
    call and the write is refused, as for the same module without ``bf.function``."""
    pick = bf.function(lambda a, b: b.view(2, 2))

    class Picks(nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return pick(a * 2, b)

    with pytest.raises(UnsupportedOpError, match="view"):
        bf.batch_map(
            _written_after_cached_calls(Picks()), [[1.0, 2.0, 3.0, 4.0], [0.5, 1.0, 1.5, 2.0]]
        )


def test_a_shallow_copy_of_a_value_that_requires_grad_is_refused() -> None:
    """Eagerly the copy is a new leaf cut from the history: no gradient reaches the layer
    (batch_map returned the value itself, and gradients reached it)."""
    layer = nn.Linear(3, 3)
    with pytest.raises(UnsupportedOpError, match=r"copy.copy at .* requires grad"):
        bf.batch_map(lambda x: copy.copy(layer(torch.tensor(x))), INSTANCES)


def test_a_call_that_gets_one_value_twice_says_why_it_is_not_cached() -> None:
    """``bil(h, h)`` is recorded op by op on every call (see Trace.aliased); the statistics
    said nothing of it."""
    bil = nn.Bilinear(3, 3, 2)

    def fn(x: list[float]) -> torch.Tensor:
        h = torch.tensor(x)
        return bil(h, h)

    _, stats = bf.batch_map(fn, INSTANCES, return_stats=True)
    assert stats.module_calls_cached == 0
    assert stats.module_misses == {
        "Bilinear: gets one value at two argument positions (recorded op by op; see "
        "Trace.aliased)": len(INSTANCES)
    }
