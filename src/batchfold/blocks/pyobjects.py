"""Blocks on Python values: ``InputTransform`` (preprocessing), ``GetItem`` and ``Slice``.

They record no graph nodes: they pick items of Python objects, tuples and sequences.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .base import Block
from .types import (
    BlockTypeError,
    BroadcastSequenceType,
    PyObjectType,
    SequenceType,
    TupleType,
    Type,
    canonical,
    short,
)
from .walker import Specializer, Tape, Walker


class InputTransform(Block):
    """A Python function on Python inputs (preprocessing): ``PyObjectType -> PyObjectType``.

    Example:
        >>> InputTransform(str.upper).eval("ab")
        'AB'
    """

    def __init__(self, fn: Callable[[Any], Any], name: str | None = None) -> None:
        self.fn = fn
        self.name = name or getattr(fn, "__qualname__", None) or short(fn, 40)
        self.in_type = PyObjectType()

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        if not isinstance(in_type, PyObjectType):
            raise BlockTypeError(self, path, "a Python object", in_type)
        fn = self.fn
        return Walker(
            PyObjectType(),
            lambda tape, x: fn(x),
            lambda em, x: em.assign(f"{em.const(fn, 'f')}({em.expr(x)})"),
        )

    def __repr__(self) -> str:
        return f"InputTransform({self.name})"


def _item_type(block: Block, key: Any, t: Type, path: str) -> Type:
    """The type of ``x[key]`` for ``x`` of type ``t`` (``key`` an int or a slice)."""
    if isinstance(t, PyObjectType):
        return t
    is_slice = isinstance(key, slice)
    if isinstance(t, TupleType) and (is_slice or type(key) is int):
        if is_slice:
            return canonical(TupleType(*t.items[key]))
        if -len(t.items) <= key < len(t.items):
            return t.items[key]
        raise BlockTypeError(block, path, f"a tuple with an item {key}", t)
    if isinstance(t, (SequenceType, BroadcastSequenceType)) and (is_slice or type(key) is int):
        return t if is_slice else t.elem
    raise BlockTypeError(block, path, "a Python object, tuple or sequence to index", t)


def _item_walker(block: Block, key: Any, t: Type, path: str) -> Walker:
    repeat = isinstance(t, BroadcastSequenceType)

    def fail(tape: Tape, key: Any, error: BaseException) -> Exception:
        return tape.fail(block, path, f"cannot read item {key!r}: {error!r}")

    def walk(tape: Tape, x: Any) -> Any:
        if repeat:
            return x if isinstance(key, slice) else x.value
        try:
            return x[key]
        except (KeyError, IndexError, TypeError) as error:
            raise fail(tape, key, error) from None

    out = _item_type(block, key, t, path)
    if repeat:
        return Walker(out, walk)
    if isinstance(t, TupleType) and type(key) is int:  # a tuple of values: read when known
        return Walker(out, walk, lambda em, x: em.item(x, key))
    return Walker(out, walk, lambda em, x: em.read(x, key, fail))


class GetItem(Block):
    """``x[key]`` of a Python object, a tuple (int or slice key) or a sequence.

    Example:
        >>> GetItem("b").eval({"a": 1, "b": 2})
        2
    """

    def __init__(self, key: Any) -> None:
        self.key = key

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        return _item_walker(self, self.key, in_type, path)

    def __repr__(self) -> str:
        return f"GetItem({self.key!r})"


class Slice(Block):
    """``x[start:stop:step]`` of a Python object, tuple or sequence (keyword arguments only).

    Example:
        >>> Slice(start=1).eval([1, 2, 3])
        [2, 3]
    """

    def __init__(
        self, *, start: int | None = None, stop: int | None = None, step: int | None = None
    ) -> None:
        self.key = slice(start, stop, step)

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        return _item_walker(self, self.key, in_type, path)

    def __repr__(self) -> str:
        parts = [f"{name}={getattr(self.key, name)!r}" for name in ("start", "stop", "step")]
        return f"Slice({', '.join(p for p in parts if not p.endswith('=None'))})"


__all__ = [
    "GetItem",
    "InputTransform",
    "Slice",
]
