"""How a recorded call is keyed.

A call's key holds its op, each lazy argument's meta, every other argument as it is (numbers
with their type, so that ``1``, ``1.0`` and ``True`` stay apart, also inside tuples, frozensets
and frozen dataclasses; tensors from outside by identity and version) and the grad mode.
Equal keys share a signature; ``Recorder.known`` builds the same parts for the commonest calls
on its fast path.
"""

from __future__ import annotations

import dataclasses
import enum
import types
from typing import Any

import numpy as np
import torch

from ..errors import LAZY_AFTER_RUN, LazyValueError
from .semantics import CODE_TYPES
from .sites import version
from .tensor import Lazy

Tensor = torch.Tensor
_mode_active = torch._C._is_torch_function_mode_enabled
_PLAIN = frozenset((type(None), str, int, float, bool))  # keyword values keyed as they are
_SIGNED_ZEROS = (complex, np.floating, np.complexfloating)  # zeros keyed by sign too
_IMMUTABLE = frozenset(
    [type(None), str, bytes, complex, torch.dtype, torch.device, torch.Size, torch.layout]
)


class CallKeys:
    """The recorder's keys of calls (a base class of ``Recorder``).

    It sets the recorder's ``by_identity`` when a key holds an object by identity, and its
    ``mutable_object`` when that object is neither a tensor (keyed with its version) nor
    code (a function, a class) and hashes by identity (a ``SimpleNamespace``, a dataclass):
    a module call with such an argument is not cached (see ``ModuleCache.call``).
    """

    by_identity: bool
    mutable_object: bool = False

    def args_key(self, args: tuple[Any, ...] | list[Any], inputs: list[int]) -> tuple[Any, ...]:
        """The key of positional arguments (see :meth:`_key`, which it equals for a list or
        tuple of them: ``torch.cat([h, c])``, ``h[:, 0]``): lazy values and numbers inline."""
        parts = []
        for a in args:
            kind = type(a)
            if kind is Lazy and a._rec is self:
                inputs.append(a._vid)
                parts.append(a._meta)
            elif kind is int or kind is bool:
                parts.append((kind, a))
            elif kind is float:  # -0.0 == 0.0, but 1 / -0.0 is -inf: the sign counts too
                parts.append((kind, a, a.hex()) if not a else (kind, a))
            elif kind is list or kind is tuple:
                parts.append((kind, *self.args_key(a, inputs)))
            else:
                parts.append(self._key(a, inputs))  # a lazy value of another run: refused there
        return tuple(parts)

    def kwargs_key(self, kwargs: dict[str, Any], inputs: list[int]) -> tuple[Any, ...]:
        """The key of keyword arguments (see :meth:`_key`).

        Keywords of plain values only (``None``, strings, numbers: ``F.cross_entropy``'s
        ``ignore_index=-100, reduction="mean"``) are keyed by names, values and types in one
        go; the types keep ``1``, ``1.0`` and ``True`` apart, which compare equal.
        """
        values = tuple(kwargs.values())
        types = tuple(map(type, values))
        if _PLAIN.issuperset(types):
            if 0.0 in values:  # -0.0 and 0.0 compare equal; their signs differ
                values = tuple(v.hex() if type(v) is float else v for v in values)
            return (tuple(kwargs), values, types)
        parts = []
        for name, value in kwargs.items():
            kind = type(value)
            if value is None or kind is str:
                parts.append((name, value))
            elif kind is int or kind is float or kind is bool:
                parts.append((name, *self._key(value, inputs)))
            else:
                parts.append((name, self._key(value, inputs)))
        return tuple(parts)

    def _key(self, obj: Any, inputs: list[int]) -> Any:
        """A hashable key for an argument; appends the value ids of lazy inputs, in order."""
        kind = type(obj)
        if kind is Lazy:
            if obj._rec is not self:
                raise LazyValueError(LAZY_AFTER_RUN.format(what="use"))
            inputs.append(obj._vid)
            return obj._meta
        if kind is tuple or kind is list:
            return (kind, *[self._key(item, inputs) for item in obj])
        if kind is dict:
            return (dict, *self.kwargs_key(obj, inputs))
        if isinstance(obj, Tensor):
            self.by_identity = True
            if _mode_active():  # from a Lazy method or a module call: the mode would see the read
                with torch._C.DisableTorchFunction():
                    return (id(obj), version(obj))
            return (id(obj), version(obj))  # shared, by identity; the signature keeps it alive
        if kind is int or kind is bool:
            return (kind, obj)
        if kind is float:
            return (kind, obj, obj.hex()) if not obj else (kind, obj)
        if kind is slice:
            return (slice, obj.start, obj.stop, obj.step)
        if kind not in _IMMUTABLE and not isinstance(obj, enum.Enum):
            self.by_identity = True  # an object that may change, or be another at that id
            if not isinstance(obj, CODE_TYPES) and kind.__hash__ in (None, object.__hash__):
                self.mutable_object = True  # keyed by identity: its attributes may change
            elif isinstance(obj, type) or _of_mutable(obj):
                self.mutable_object = True  # a class, or an object's bound method: the same
        if isinstance(obj, tuple) and not any(type(i) is Lazy for i in obj):
            return (kind, *[self._key(i, inputs) for i in obj])  # P(1, 2) == P(1.0, 2)
        if kind is frozenset:
            members: Any = obj
            return (kind, frozenset(self._key(item, inputs) for item in members))
        if dataclasses.is_dataclass(obj) and kind.__hash__ not in (None, object.__hash__):
            values = [getattr(obj, field.name) for field in dataclasses.fields(obj)]
            if not any(type(v) is Lazy for v in values):  # D(1) == D(1.0): field by field
                return (kind, *[self._key(v, inputs) for v in values])
        try:
            hash(obj)
        except (TypeError, ValueError):  # a writable memoryview raises ValueError
            return ("object", id(obj))
        if not _by_value(obj):  # a user's object equal by value (a tree node by its index, a
            self.mutable_object = True  # str subclass): a forward may read more of it
            return ("object", id(obj))
        if isinstance(obj, _SIGNED_ZEROS) and not obj:  # np.float64(-0.0) == 0.0; 1 / it is not
            return (kind, obj, repr(obj))
        return (kind, obj)  # equal objects of two types (np.int64(1), np.float64(1)) apart


def _of_mutable(obj: Any) -> bool:
    """Whether ``obj`` is a method bound to an object whose attributes may change."""
    return type(obj) is types.MethodType and not _by_value(obj.__self__)


_VALUE_MODULES = frozenset(["builtins", "torch", "numpy", "enum"])


def _by_value(obj: Any) -> bool:
    """Whether equal objects of ``obj``'s type compute alike: Python's, PyTorch's and NumPy's
    own values and enums, not a user's class whose ``__eq__`` compares some of its state."""
    module = type(obj).__module__
    return module.partition(".")[0] in _VALUE_MODULES or isinstance(obj, enum.Enum)
