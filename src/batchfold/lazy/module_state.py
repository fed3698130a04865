"""Which modules had an attribute set while ``batch_map`` records, so that cached calls of a
module changed between calls are traced again.

A cached call does not run the module's Python, so it uses the attributes the module had when
its entry was made (``self.scale``, a submodule, a parameter, ``training`` of a submodule).
While the hooks are in place, ``nn.Module.__setattr__`` notes the module it sets an attribute
of and the count of such sets (:data:`EPOCH`), and so do the ways that write into a module's
dicts without it (:func:`note_member_swaps`); a module cache that sees the count move drops
the entries one of whose modules had an attribute set since the entry was made (set to an
equal value too: its next calls are traced again, no more). A change inside a list or dict
attribute, made without setting an attribute, is not seen (the README says to mark such
modules ``bf.no_cache``).

What a traced call itself changes of its module in Python, which a cached call would not
change again, is found by comparing :func:`attribute_state` before and after the call
(:func:`changed_attribute`).
"""

from __future__ import annotations

import collections
import copy
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.utils._named_member_accessor as _accessor
from torch import Tensor, nn

from ..errors import UnsupportedOpError
from .context import dry, stop_dry
from .sites import user_site
from .tensor import Lazy

EPOCH = [0]
"""How many module attributes were set while the hooks were in place."""

SET_AT: dict[int, int] = {}
"""``id(module)`` -> the :data:`EPOCH` of its last attribute set."""

_LOG: list[int] = []  # ids of the modules set, in order: _LOG[k] at EPOCH _LOG_START[0] + k + 1
_LOG_START = [0]
_LOG_MAX = 1 << 16  # then the log starts again, and a cache behind it checks every entry
_LOCK = threading.Lock()

ORIGINAL_SETATTR = nn.Module.__setattr__


ACTIVE = [0]
"""How many ``batch_map`` calls are recording (the hooks' count): only then are sets noted."""


def module_setattr(module: nn.Module, name: str, value: Any) -> None:
    """``nn.Module.__setattr__``, noting the module while ``batch_map`` records (see the
    module docstring). It takes PyTorch's place once, at the first ``batch_map``, and stays:
    replacing a method of ``nn.Module`` updates a slot of every subclass, about 0.15 ms
    each way, and slows attribute lookups after it, too much for every call."""
    if ACTIVE[0]:
        if dry():  # a dry trace sets nothing (see dry_trace.py)
            stop_dry(f"{type(module).__name__}.{name} = ...")
        _note(module)
        _lazy_set(module, name, value)
    ORIGINAL_SETATTR(module, name, value)


def _lazy_set(module: nn.Module, name: str, value: Any) -> None:
    if type(value) is Lazy:  # its value takes its place at the end (settle_attributes)
        with _LOCK:
            LAZY_SETS.append((value._rec, module, name, value, value._rec.instance))


LAZY_SETS: list[tuple[Any, nn.Module, str, Lazy, int]] = []
"""Module attributes set to lazy values: ``(recorder, module, name, value, instance)``."""


def attribute_values(rec: Any) -> list[Lazy]:
    """The lazy values :func:`settle_attributes` will read once ``rec``'s batch has run."""
    with _LOCK:
        mine = [entry for entry in LAZY_SETS if entry[0] is rec]
    return [value for _, _, value in _final(mine)]


def settle_attributes(rec: Any, values: Callable[[list[Lazy]], list[Any]] | None) -> None:
    """Set each module attribute that ``rec``'s instances set to a lazy value, and that holds
    one still, to the value eager code leaves there: the last set of the last instance that
    set it (``self.pe = torch.arange(n)``, a table kept on first use), which ``values``
    computes. Without ``values`` (the run failed), forget them."""
    with _LOCK:  # other threads' runs append theirs meanwhile
        mine = [entry for entry in LAZY_SETS if entry[0] is rec]
        LAZY_SETS[:] = [entry for entry in LAZY_SETS if entry[0] is not rec]
    if values is None:
        return
    for module, name, value in _final(mine):
        ORIGINAL_SETATTR(module, name, values([value])[0])


def _final(mine: list[tuple[Any, nn.Module, str, Lazy, int]]) -> list[tuple[nn.Module, str, Lazy]]:
    """Of a run's sets of module attributes to lazy values, those eager code leaves: per
    attribute, the last set of the last instance, where the attribute holds a lazy value
    still."""
    final: dict[tuple[int, str], tuple[nn.Module, str, Lazy, int]] = {}
    for _, module, name, value, instance in mine:
        key = (id(module), name)
        if key not in final or instance >= final[key][3]:
            final[key] = (module, name, value, instance)
    return [
        (module, name, value)
        for module, name, value, _ in final.values()
        if type(vars(module).get(name)) is Lazy
    ]


def _note(module: nn.Module) -> None:
    with _LOCK:  # threads recording at once: each set at its own place in the log
        EPOCH[0] += 1
        SET_AT[id(module)] = EPOCH[0]
        if len(_LOG) >= _LOG_MAX:
            _LOG.clear()
            _LOG_START[0] = EPOCH[0] - 1
        _LOG.append(id(module))


def _noting(swap: Callable[..., Any]) -> Callable[..., Any]:
    def noted(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if ACTIVE[0]:
            _note(module)
            if any(type(a) is Lazy for a in (*args, *kwargs.values())):
                raise UnsupportedOpError(
                    f"{swap.__name__} of {type(module).__name__} with a per-instance value "
                    f"at {user_site()}: a module's parameters, buffers and submodules are "
                    "shared by every instance inside batch_map (torch.func.functional_call "
                    "with per-instance parameters cannot be batched). Pass the value to "
                    "the module's forward, or compute with it functionally (F.linear)."
                )
        return swap(module, *args, **kwargs)

    noted.__wrapped__ = swap  # type: ignore[attr-defined]
    noted.noting = True  # type: ignore[attr-defined]
    return noted


def note_member_swaps() -> None:
    """Note the modules whose parameters, buffers, submodules and hooks change without
    ``__setattr__``: ``register_buffer``, ``register_parameter``, ``add_module``, ``del``,
    ``ModuleList.insert``, ``Sequential.insert``, ``ModuleDict.clear`` and the hook
    registrations write into a module's dicts, and so do the swaps of
    ``torch.func.functional_call`` (``torch.nn.utils._named_member_accessor``). Once a
    process, as :func:`module_setattr`."""
    for owner, names in _SWAPS:
        for name in names:
            swap = getattr(owner, name, None)
            if swap is not None and not getattr(swap, "noting", False):
                setattr(owner, name, _noting(swap))


_HOOK_KINDS = ("forward_", "forward_pre_", "full_backward_", "full_backward_pre_", "backward_")
_SWAPS = (
    (_accessor, ("set_tensor", "swap_tensor", "swap_submodule")),
    (nn.Module, ("register_buffer", "register_parameter", "add_module", "__delattr__")),
    (nn.Module, tuple(f"register_{kind}hook" for kind in _HOOK_KINDS)),
    (nn.ModuleList, ("insert",)),  # these write into ``_modules`` themselves
    (nn.Sequential, ("insert",)),
    (nn.ModuleDict, ("clear",)),
)


def _set_since(epoch: int) -> tuple[set[int] | None, int]:
    """The ids of the modules that had an attribute set after :data:`EPOCH` ``epoch`` (``None``
    where the log no longer reaches back that far), and the epoch now."""
    with _LOCK:
        start = epoch - _LOG_START[0]
        return (None if start < 0 else set(_LOG[start:])), EPOCH[0]


def forget_sets() -> None:
    """Forget every set noted (the last ``batch_map`` has stopped recording)."""
    with _LOCK:
        SET_AT.clear()
        _LOG.clear()
        _LOG_START[0] = EPOCH[0]


class Watch:
    """The modules of a cache entry (the module and its submodules), and the :data:`EPOCH` at
    which the entry was made."""

    __slots__ = ("members", "since")

    def __init__(self, module: nn.Module) -> None:
        self.members = [id(m) for m in module.modules()]
        self.since = EPOCH[0]

    def changed(self) -> bool:
        """Whether one of the modules had an attribute set since the entry was made."""
        since = self.since
        return any(SET_AT.get(m, 0) > since for m in self.members)


class Watchers:
    """Which entries of a module cache watch which modules (keys by ``id(module)``), so that a
    set is checked against the entries watching its module alone: a module that sets an
    attribute on every call would otherwise cost a check of every entry per call."""

    def __init__(self) -> None:
        self.keys: dict[int, set[Any]] = {}

    def watch(self, key: Any, module: nn.Module) -> Watch:
        """The :class:`Watch` of a new entry ``key`` of ``module``'s calls."""
        watch = Watch(module)
        keys = self.keys
        for m in watch.members:
            keys.setdefault(m, set()).add(key)
        return watch

    def suspects(self, entries: dict[Any, Any], since: int) -> tuple[Any, int]:
        """The keys among ``entries`` watching a module set after :data:`EPOCH` ``since``
        (every key where the log of sets no longer reaches back that far), and the epoch
        they cover."""
        changed, now = _set_since(since)
        if changed is None:
            return list(entries), now
        keys = self.keys
        return {key for m in changed for key in keys.get(m, ())}, now


_DEPTH = 3  # how deep into containers and plain objects a module's attributes are compared
_MOST = 10_000  # items compared of one container (beyond: its length only)
_ATOMS = (type(None), bool, int, float, complex, str, bytes, Tensor, torch.nn.Module)


class _Seen:
    """One container or plain object as a call found it: the object and what it held."""

    __slots__ = ("obj", "items", "size")

    def __init__(self, obj: Any, items: list[tuple[Any, Any]], size: int) -> None:
        self.obj, self.items, self.size = obj, items, size


def _seen(value: Any, depth: int) -> Any:
    """``value`` with what it holds (dicts, lists, deques, sets, plain objects' attributes),
    ``depth`` levels down; the objects themselves are kept, so their ids stay theirs."""
    if isinstance(value, _ATOMS) or depth == 0:
        return value
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, (list, collections.deque)):
        items = [(None, v) for v in value]  # by position
    elif isinstance(value, (set, frozenset)):
        return _Seen(value, [], len(value))  # membership: by the length
    elif hasattr(value, "__dict__") and not callable(value):
        items = list(vars(value).items())
    else:
        return value
    seen = [(k, _seen(v, depth - 1)) for k, v in items[:_MOST]]
    return _Seen(value, seen, len(items))


def _same(before: Any, after: Any) -> bool:
    """Whether two :func:`_seen` of one place found the same objects holding the same."""
    if type(before) is not _Seen or type(after) is not _Seen:
        return before is after
    return (
        before.obj is after.obj
        and before.size == after.size
        and all(
            (k is k2 or type(k) in (str, int) and k == k2) and _same(v, v2)
            for (k, v), (k2, v2) in zip(before.items, after.items, strict=True)
        )
    )


def attribute_state(module: torch.nn.Module) -> list[tuple[Any, Any]]:
    """What a call could change of ``module`` and its submodules in Python: their attributes,
    and what lists, dicts, deques and plain objects among them hold (a few levels down)."""
    return [(m, _seen(vars(m), _DEPTH)) for m in module.modules()]


def changed_attribute(state: list[tuple[Any, Any]]) -> str | None:
    """The first attribute of a module a call changed since :func:`attribute_state` (``None``:
    none). A cached call would not run the module's Python again, so the change would happen
    only on the calls that were traced; such modules are recorded op by op instead."""
    for module, before in state:
        after = _seen(vars(module), _DEPTH)
        if after.size != before.size:
            return f"{type(module).__name__} (an attribute added or removed)"
        for (name, value), (_, now) in zip(before.items, after.items, strict=True):
            if not _same(value, now):
                return f"{type(module).__name__}.{name}"
    return None


_CONTAINERS = (list, dict, collections.deque)


class Held:
    """Each list, dict and deque among a call's arguments, and among the attributes of a
    module and its submodules where given, with a shallow copy: what a forward may change in
    Python without setting an attribute (``cache.append(h)``, ``self.acts.append(h)``).

    Arguments:
        module: the module called, or ``None`` where :func:`attribute_state` watches it (a
            real trace: only a dry trace, which must undo such changes, looks here).
        call: the call's ``(args, kwargs)``.
    """

    def __init__(self, module: nn.Module | None, call: Any) -> None:
        members = module.modules() if module is not None else ()
        found = [v for m in members for v in vars(m).values() if type(v) in _CONTAINERS]
        found += [v for part in call for v in (part.values() if type(part) is dict else part)]
        self.saved = [(v, copy.copy(v)) for v in found if type(v) in _CONTAINERS]

    def changed(self, restore: bool) -> bool:
        """Whether any of them now holds other objects (compared by identity: an ``==`` of
        lazy values would record ops); with ``restore``, their contents are put back."""
        changed = False
        for now, before in self.saved:
            if type(now) is dict:
                same = list(now) == list(before) and all(now[k] is before[k] for k in now)
            else:
                same = len(now) == len(before) and all(
                    a is b for a, b in zip(now, before, strict=True)
                )
            if not same:
                changed = True
                if restore:
                    now.clear()
                    if isinstance(now, dict):
                        now.update(before)
                    else:
                        now.extend(before)
        return changed
