"""Confirmed traces of module calls on sequences, kept for later ``batch_map`` calls.

A module call on ragged inputs confirmed in one ``batch_map`` (two traces of different
lengths that agree) is confirmed in a later one without tracing it again when the module is
in the same state (:func:`module_state`): the same object, the same parameter and buffer
tensors with the same shapes, dtypes and devices, every submodule in the same train/eval mode
with the same plain attributes (numbers, strings, flags) and no hooks. A trace is kept only
when every tensor from outside that its ops read is one of those parameters or buffers: a
tensor computed from them once (``W.t()`` outside the op) would be stale after an optimizer
step; and only when its ops draw no random numbers (see :func:`keep`). As for every cached call, the module must not branch on other Python state (a global,
a call counter): mark such a module ``bf.no_cache``.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import torch
from torch import nn

from .semantics import is_random

Tensor = torch.Tensor
_PLAIN = frozenset([int, float, bool, str, type(None)])
_MAX_KEPT = 256
_KEPT: dict[Any, tuple[weakref.ref[nn.Module], tuple[Any, ...], Any]] = {}
_LOCK = threading.Lock()


def module_state(module: nn.Module) -> tuple[Any, ...] | None:
    """What a kept trace of ``module`` depends on besides its arguments; ``None`` if it or a
    submodule has hooks (its calls are recorded op by op then)."""
    parts: list[Any] = []
    for m in module.modules():
        if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks:
            return None
        tensors = [*m._parameters.values(), *m._buffers.values()]
        plain = tuple(
            (name, value)
            for name, value in m.__dict__.items()
            if type(value) in _PLAIN
            or (type(value) is tuple and all(type(v) in _PLAIN for v in value))
        )
        parts.append(
            (
                id(m),
                m.training,
                tuple(
                    None if t is None else (id(t), t.shape, t.dtype, t.device, t.requires_grad)
                    for t in tensors
                ),
                plain,
            )
        )
    return tuple(parts)


def draws_random(ops: list[tuple[Any, ...]]) -> bool:
    """Whether a template's ops (``(signature, refs, payload)`` each) draw random numbers."""
    return any(is_random(op[0].func) for op in ops)


def keep(
    key: Any,
    module: nn.Module,
    ops: list[tuple[Any, ...]],
    shared: tuple[tuple[Tensor, int], ...],
    value: Any,
) -> None:
    """Keep ``value`` (a confirmed call's template, of ``ops``) for ``key``, if its ops read no
    tensor from outside but ``module``'s parameters and buffers (``shared``: those they read)
    and draw no random numbers: a call traced in one ``batch_map`` and not in another draws
    its numbers in other steps, so a run's dropout masks would depend on what ran before it
    in the process (a resumed run would not continue exactly)."""
    if draws_random(ops):
        return
    own = {id(t) for t in module.parameters()} | {id(t) for t in module.buffers()}
    if any(id(t) not in own for t, _ in shared):
        return
    state = module_state(module)
    if state is None:
        return
    with _LOCK:
        if len(_KEPT) >= _MAX_KEPT:
            _KEPT.clear()  # rare: a process with this many kinds of call
        _KEPT[key] = (weakref.ref(module), state, value)


def kept(key: Any, module: nn.Module) -> Any:
    """The value kept for ``key`` if ``module`` is the module it was kept for, in the same
    state; else ``None``."""
    found = _KEPT.get(key)
    if found is None or found[0]() is not module or module_state(module) != found[1]:
        return None
    return found[2]


def forget() -> None:
    """Drop every kept trace (tests; a process that wants every call traced again)."""
    with _LOCK:
        _KEPT.clear()
