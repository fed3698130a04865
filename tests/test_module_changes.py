"""A module changed between its calls inside one ``batch_map`` (an attribute, a parameter or a
submodule replaced, a submodule switched to eval) is traced again, so its cached calls do what
eager calls do with the module as it is then. Each case once replayed the first calls'
module, silently (``batchfold.lazy.module_state``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import batchfold as bf
from batchfold.schedule import Scheduler

pytestmark = pytest.mark.usefixtures("float64")


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.drop = nn.Dropout(0.5)
        self.scale = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.lin(x)) * self.scale


def _changes() -> dict[str, Callable[[_Scaled], Any]]:
    weight, linear = nn.Parameter(torch.ones(3, 3)), nn.Linear(3, 3)
    return {
        "attribute": lambda m: setattr(m, "scale", 5.0),
        "parameter": lambda m: setattr(m.lin, "weight", weight),
        "submodule": lambda m: setattr(m, "lin", linear),
        "submodule eval": lambda m: m.drop.eval(),
    }


@pytest.mark.parametrize("change", list(_changes()))
@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_a_module_changed_between_calls_is_traced_again(change: str, scheduler: Scheduler) -> None:
    changes = _changes()  # the same new weights for both runs

    def calls(module: _Scaled) -> Callable[[list[float]], Any]:
        def fn(x: list[float]) -> Any:
            t = torch.tensor(x)
            _ = module(t), module(t * 2)  # traced twice: confirmed, then cached
            changes[change](module)
            return module(t * 3)  # eagerly with the changed module

        return fn

    inputs = [[1.0, -2.0, 0.5], [0.0, 1.0, 2.0], [3.0, 1.0, -1.0]]
    want = []
    for x in inputs:  # a fresh module per instance, as the batch's first instance sees it
        torch.manual_seed(0)
        module = _Scaled()
        module.drop.p = 0.0 if change != "submodule eval" else module.drop.p
        want.append(calls(module)(x))
    torch.manual_seed(0)
    module = _Scaled()
    module.drop.p = 0.0 if change != "submodule eval" else module.drop.p
    got = bf.batch_map(calls(module), inputs, scheduler=scheduler)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)


class _Tagged(nn.Module):
    tag: int = 0


@pytest.mark.parametrize("log_max", [2, 1 << 16])
def test_a_change_is_seen_whether_or_not_the_log_of_sets_reaches_back(
    monkeypatch: pytest.MonkeyPatch, log_max: int
) -> None:
    """Entries are checked for the modules set since the cache last looked (a log of sets);
    where the log has started again since, every entry is checked."""
    from batchfold.lazy import module_state

    monkeypatch.setattr(module_state, "_LOG_MAX", log_max)
    other = _Tagged()

    def calls(module: _Scaled) -> Callable[[list[float]], Any]:
        def fn(x: list[float]) -> Any:
            t = torch.tensor(x)
            _ = module(t), module(t * 2)
            for k in range(5):  # sets of another module: the log fills and starts again
                other.tag = k
            module.scale = 5.0
            other.tag = -1
            return module(t * 3)

        return fn

    inputs = [[1.0, -2.0, 0.5], [0.0, 1.0, 2.0]]
    want = []
    for x in inputs:
        torch.manual_seed(0)
        module = _Scaled()
        module.drop.p = 0.0
        want.append(calls(module)(x))
    torch.manual_seed(0)
    module = _Scaled()
    module.drop.p = 0.0
    got = bf.batch_map(calls(module), inputs)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_functional_call_with_other_parameters_per_call_is_seen(scheduler: Scheduler) -> None:
    """``torch.func.functional_call`` swaps parameters by writing into the module's dicts, not
    through ``__setattr__``: the cache once replayed the first call's parameters for every
    call (silently)."""
    from torch.func import functional_call

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 2))
    sets = [{k: torch.randn_like(v) for k, v in model.named_parameters()} for _ in range(2)]

    def fn(item: tuple[list[float], int]) -> Any:
        x, i = item
        h = torch.tensor(x)
        return (
            functional_call(model, sets[i], (h,)),
            model(h),
            functional_call(model, sets[1 - i], (h,)),
        )

    items = [
        ([1.0, 2.0, 3.0], 0),
        ([0.5, -1.0, 2.0], 1),
        ([2.0, 0.0, 1.0], 0),
        ([1.0, 1.0, 1.0], 1),
    ]
    want = [fn(item) for item in items]
    got = bf.batch_map(fn, items, scheduler=scheduler)
    for g, w in zip(got, want, strict=True):
        for a, b in zip(g, w, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


class _Buffered(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.register_buffer("shift", torch.zeros(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + self.shift


def _doubled(module: nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor:
    return out * 2


def _registrations() -> dict[str, Callable[[_Buffered], Any]]:
    shift, bias, lin = torch.full((3,), 3.0), nn.Parameter(torch.full((3,), 5.0)), nn.Linear(3, 3)
    nn.init.constant_(lin.weight, 0.5)  # not the weights the module's own layer starts with
    return {
        "register_buffer": lambda m: m.register_buffer("shift", shift),
        "register_parameter": lambda m: m.lin.register_parameter("bias", bias),
        "add_module": lambda m: m.add_module("lin", lin),
        "register_module": lambda m: m.register_module("lin", lin),
        "del": lambda m: (delattr(m, "shift"), m.register_buffer("shift", shift)),
        "forward hook": lambda m: m.lin.register_forward_hook(_doubled),
        "forward pre-hook": lambda m: m.lin.register_forward_pre_hook(lambda _, x: (x[0] * 3,)),
    }


@pytest.mark.parametrize("change", list(_registrations()))
def test_a_member_registered_between_calls_is_seen(change: str) -> None:
    """``register_buffer``, ``register_parameter``, ``add_module``, ``del`` and a submodule's
    hook registration write into the module's dicts without ``__setattr__``: cached calls
    once kept the old member, or ran without the hook."""
    changes = _registrations()  # the same tensors for both runs

    def fn(item: tuple[list[float], bool], module: _Buffered) -> Any:
        x, change_it = item
        t = torch.tensor(x)
        before = module(t), module(t * 2)
        if change_it:
            changes[change](module)
        return (*before, module(t * 3))

    items = [([1.0, 2.0, 3.0], False), ([0.5, -1.0, 2.0], True), ([2.0, 0.0, 1.0], False)]
    torch.manual_seed(0)
    module = _Buffered()
    want = [fn(item, module) for item in items]
    torch.manual_seed(0)
    module = _Buffered()
    got = bf.batch_map(lambda item: fn(item, module), items)
    for g, w in zip(got, want, strict=True):
        for a, b in zip(g, w, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
