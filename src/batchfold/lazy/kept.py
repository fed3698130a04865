"""Confirmed traces of module calls, kept for later ``batch_map`` calls of the process.

A module call of several ops confirmed in one ``batch_map`` (two traces that agree) is
confirmed in a later one by a dry trace of its first call (see :mod:`.dry_trace` and
:func:`still_same`) when the module is in the same state (:func:`snapshot`): the same module objects (of the same types) with the same parameter and
buffer tensors (same objects, shapes, dtypes, devices, ``requires_grad``), the same attributes
(numbers, strings, dtypes and the like by value; functions by identity; weak references by
their referents; lists, tuples and dicts of those item by item), no hooks, and the same default dtype and autocast state. A
module holding any other kind of object (a config object, a mutable user type) is never kept.

A trace is kept only when nothing it depends on can change unseen (see :func:`keep`): every
tensor from outside that its ops read, and every tensor whose attributes it read, is one of
the module's parameters or buffers (a tensor computed from them once, ``W.t()`` outside the
op, would be stale after an optimizer step); it read no tensor's value into Python
(``float(self.scale)``: in-place updates would not be seen); its key holds no object by
identity; and its ops draw no random numbers (a call traced in one ``batch_map`` and not in
another draws its numbers in other steps, so a run's dropout masks would depend on what ran
before it in the process, and a resumed run would not continue exactly). As for every cached
call, the module must not branch on other Python state (a global, a call counter) that
changes within one ``batch_map``: mark such a module ``bf.no_cache``.

Kept traces live as long as their module (a weak dictionary), at most :data:`MAX_KEPT` per
module.
"""

from __future__ import annotations

import enum
import threading
import weakref
from typing import Any

import torch
from torch import nn

from ..ragged import family_key, ragged_meta
from . import graphs
from .semantics import CODE_TYPES, is_random, own_hooks, run_context
from .traces import same_payload

Tensor = torch.Tensor
MAX_KEPT = 256
_PLAIN = frozenset([int, float, bool, str, bytes, complex, type(None)])
_BY_VALUE = frozenset([torch.dtype, torch.device, torch.Size, torch.layout, torch.memory_format])
_BY_IDENTITY = CODE_TYPES
# a module's own bookkeeping: parameters, buffers and submodules are compared apart, hooks
# make a module unkeepable, state-dict hooks do not change its calls
_SKIP = frozenset(
    [
        "_parameters",
        "_buffers",
        "_modules",
        "_backward_pre_hooks",
        "_backward_hooks",
        "_forward_hooks",
        "_forward_hooks_with_kwargs",
        "_forward_hooks_always_called",
        "_forward_pre_hooks",
        "_forward_pre_hooks_with_kwargs",
        "_state_dict_hooks",
        "_state_dict_pre_hooks",
        "_load_state_dict_pre_hooks",
        "_load_state_dict_post_hooks",
    ]
)
_MISSING = object()
_KEPT: weakref.WeakKeyDictionary[nn.Module, dict[Any, tuple[Any, ...]]] = (
    weakref.WeakKeyDictionary()
)
_LOCK = threading.Lock()


def _ref(obj: Any) -> Any:
    try:
        return weakref.ref(obj)
    except TypeError:
        return obj  # builtins and the like: held, they are small and live for the process


def _deref(held: Any) -> Any:
    return held() if type(held) is weakref.ReferenceType else held


def _snap(value: Any, depth: int = 0) -> Any:
    """A comparable record of one attribute value; ``_MISSING`` if it cannot be kept."""
    kind = type(value)
    if kind in _PLAIN or kind in _BY_VALUE or isinstance(value, enum.Enum):
        return ("=", value)
    if isinstance(value, Tensor):
        return ("tensor", _ref(value), value.shape, value.dtype, value.device, value.requires_grad)
    if isinstance(value, _BY_IDENTITY):
        return ("is", _ref(value))
    if kind is weakref.ReferenceType:  # nn.LSTM's _flat_weight_refs: remade, same referents
        target = value()
        return ("ref", None if target is None else _ref(target))
    if depth < 3 and kind in (tuple, list):
        items = [_snap(v, depth + 1) for v in value]
        return _MISSING if _MISSING in items else ("seq", kind, tuple(items))
    if depth < 3 and kind in (set, frozenset) and all(type(v) in _PLAIN for v in value):
        return ("set", kind, frozenset(value))
    if depth < 3 and isinstance(value, dict) and all(type(k) in _PLAIN for k in value):
        items = [(k, _snap(v, depth + 1)) for k, v in value.items()]
        return _MISSING if any(s is _MISSING for _, s in items) else ("dict", kind, tuple(items))
    return _MISSING


def _same(snap: Any, value: Any) -> bool:
    tag = snap[0]
    if tag == "=":
        return type(value) is type(snap[1]) and value == snap[1]
    if tag == "tensor":
        _, held, shape, dtype, device, grad = snap
        return (
            _deref(held) is value
            and value.shape == shape
            and value.dtype == dtype
            and value.device == device
            and value.requires_grad == grad
        )
    if tag == "is":
        return _deref(snap[1]) is value
    if tag == "ref":
        if type(value) is not weakref.ReferenceType:
            return False
        target = value()
        return target is None if snap[1] is None else _deref(snap[1]) is target
    if tag == "set":
        return type(value) is snap[1] and value == snap[2]
    if type(value) is not snap[1] or len(value) != len(snap[2]):
        return False
    if tag == "seq":
        return all(_same(s, v) for s, v in zip(snap[2], value, strict=True))
    return all(  # "dict"
        k == name and _same(s, value[k]) for (name, s), k in zip(snap[2], value, strict=True)
    )


def snapshot(module: nn.Module) -> tuple[Any, ...] | None:
    """What a kept trace of ``module`` depends on besides its arguments; ``None`` if the
    module cannot be kept (hooks, or an attribute of a kind not compared)."""
    parts = []
    for m in module.modules():
        if own_hooks(m):
            return None
        attributes = []
        for name, value in m.__dict__.items():
            if name not in _SKIP:
                snap = _snap(value)
                if snap is _MISSING:
                    return None
                attributes.append((name, snap))
        tensors = tuple(
            (name, None if t is None else _snap(t))
            for name, t in (*m._parameters.items(), *m._buffers.items())
        )
        parts.append((weakref.ref(m), type(m), tuple(attributes), tensors))
    return (run_context(), tuple(parts))


def unchanged(state: tuple[Any, ...], module: nn.Module) -> bool:
    """Whether ``module`` is in the state :func:`snapshot` recorded."""
    context, parts = state
    if context != run_context():
        return False
    modules = list(module.modules())
    if len(modules) != len(parts):
        return False
    for m, (held, kind, attributes, tensors) in zip(modules, parts, strict=True):
        if held() is not m or type(m) is not kind or own_hooks(m):
            return False
        names = [name for name in m.__dict__ if name not in _SKIP]
        if names != [name for name, _ in attributes]:
            return False
        if not all(_same(snap, m.__dict__[name]) for name, snap in attributes):
            return False
        now = (*m._parameters.items(), *m._buffers.items())
        if len(now) != len(tensors):
            return False
        for (name, t), (was, snap) in zip(now, tensors, strict=True):
            if name != was or (t is None) != (snap is None):
                return False
            if t is not None and not _same(snap, t):
                return False
    return True


def draws_random(ops: list[tuple[Any, ...]]) -> bool:
    """Whether a template's ops (``(signature, refs, payload)`` each) draw random numbers."""
    return any(is_random(op[0].func) for op in ops)


def keep(
    key: Any,
    module: nn.Module,
    ops: list[tuple[Any, ...]],
    shared: tuple[tuple[Tensor, int], ...],
    read: list[Tensor] | None,
    value: Any,
) -> None:
    """Keep ``value``, the confirmed template of ``ops``, for calls of ``module`` with ``key``.

    ``shared`` holds the tensors from outside that the ops read; ``read`` the tensors whose
    attributes the traces read, or ``None`` when a trace read a tensor's value into Python or
    the key holds an object by identity. Nothing is kept unless every such tensor is a
    parameter or buffer of ``module``, no op draws random numbers, no autocast is on, and the
    module's state can be recorded (see the module docstring).
    """
    if read is None or draws_random(ops) or any(run_context()[1:]):
        return
    own = {id(t) for t in module.parameters()} | {id(t) for t in module.buffers()}
    if any(id(t) not in own for t, _ in shared) or any(id(t) not in own for t in read):
        return
    state = snapshot(module)
    if state is None:
        return
    with _LOCK:
        entries = _KEPT.setdefault(module, {})
        if len(entries) >= MAX_KEPT:
            entries.clear()  # rare: a module called with this many kinds of argument
        entries[key] = (state, value)


def kept(key: Any, module: nn.Module) -> Any:
    """The value kept for ``key`` if ``module`` is still in the state it was kept in, else
    ``None``."""
    entries = _KEPT.get(module)
    found = None if entries is None else entries.get(key)
    if found is None:
        return None
    with torch._C.DisableTorchFunction():  # the state is read with getters: not recorded
        if not unchanged(found[0], module):
            return None
    return found[1]


def still_same(earlier: Any, found: Any) -> bool:
    """Whether ``found``, this run's trace of a call, recorded the ops of ``earlier``, the
    template kept for the call's key, on the same values.

    A kept template is not used on the module's state alone: its forward may read what no
    snapshot holds (a global, a class attribute, a closure), and a number read there is a
    constant of the template. So each ``batch_map`` traces its first call of a kept key and
    compares. The ops' signatures cannot be compared by identity: a key holds each tensor
    from outside with its version, which an optimizer step moves. Here a tensor counts by
    identity alone (:func:`unversioned`), and an op on packed rows by its family's key, which
    holds no length.
    """
    if (
        len(found.ops) != len(earlier.ops)
        or found.outputs != earlier.outputs
        or found.handed_back != earlier.handed_back
        or found.structure != earlier.structure
        or getattr(found, "op_ragged", None) != getattr(earlier, "op_ragged", None)
    ):
        return False
    rows = getattr(found, "op_ragged", None) or [None] * len(found.ops)
    for (sig, refs, payload), (was, refs2, payload2), ragged in zip(
        found.ops, earlier.ops, rows, strict=True
    ):
        if refs != refs2 or not same_payload(payload, payload2):
            return False
        if sig is not was and _op_key(sig, ragged is not None) != _op_key(was, ragged is not None):
            return False
    return True


def _op_key(sig: Any, ragged: bool) -> Any:
    """``sig``'s key with tensors by identity; an op on packed rows its family's key."""
    shared = {id(t) for t, _ in sig.shared}
    family = sig.family
    if not ragged or family is None:
        return unversioned(sig.key, shared)
    if sig.source is not None:
        return (family.kind, ragged_meta(sig.out_metas[0]))
    key = family_key(sig.key, family.ragged_in, family.square)
    return (family.kind, family.ragged_in, unversioned(key, shared))


def unversioned(part: Any, shared: set[int]) -> Any:
    """A key with every ``(id, version)`` of a tensor in ``shared`` made ``(id,)``."""
    if type(part) is not tuple:
        return part
    if len(part) == 2 and type(part[0]) is int and type(part[1]) is int and part[0] in shared:
        return (part[0],)
    return tuple(unversioned(item, shared) for item in part)


def kept_keys(module: nn.Module) -> list[Any]:
    """The keys of ``module``'s kept traces (whether its state still matches or not)."""
    with _LOCK:
        return list(_KEPT.get(module, ()))


def forget() -> None:
    """Drop every kept trace, and this thread's kept graphs (tests; a process that wants
    every call traced again)."""
    with _LOCK:
        _KEPT.clear()
    graphs.forget()
