"""Blocks that route values between other blocks: ``Pipe``, ``Record``, ``AllOf``, plus ``Void``
and ``Metric``; ``OneOf`` and ``Optional`` are in :mod:`batchfold.blocks.conditionals` and
importable from here as well.

None of them records graph nodes itself (a ``Metric`` only notes the value ids sent to it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .base import Block
from .codegen import Emitter, Symbol
from .conditionals import OneOf, Optional
from .convert import constructors, convert_to_block, register_converter
from .types import (
    BlockTypeError,
    PyObjectType,
    TensorType,
    TupleType,
    Type,
    VoidType,
    canonical,
    short,
)
from .walker import Specializer, Tape, Walker


class Pipe(Block):
    """Function composition: ``Pipe(a, b, c)`` computes ``c(b(a(x)))``; ``a >> b`` makes one.

    Example:
        >>> from batchfold.blocks import Map, Scalar, Sum
        >>> Pipe(Map(Scalar()), Sum()).eval([1.0, 2.0])
        tensor(3.)
    """

    def __init__(self, *blocks: Any) -> None:
        flat: list[Block] = []
        for item in blocks:
            block = convert_to_block(item)
            flat.extend(block.blocks if isinstance(block, Pipe) else [block])
        if not flat:
            raise ValueError("Pipe needs at least one block")
        self.blocks = tuple(flat)
        self.in_type = self.blocks[0].in_type
        self._check()

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        walkers = []
        t = in_type
        for i, block in enumerate(self.blocks):
            child = f"{path}[{i}]"
            try:
                walker = ctx.child(block, t, child)
            except BlockTypeError as error:
                if child in error.entries and not error.source and error.got is not None:
                    if i > 0:
                        raise error.with_source(self.blocks[i - 1], f"{path}[{i - 1}]") from None
                    error.entries.append(path)  # the pipe's own input was refused
                raise
            walkers.append(walker)
            t = walker.out_type
        if len(walkers) == 1:
            return walkers[0]
        walks = [walker.walk for walker in walkers]

        def emit(em: Emitter, x: Symbol) -> Symbol:
            for walker in walkers:
                x = em.value(walker, x)
            return x

        if len(walks) == 2:
            first, second = walks
            return Walker(t, lambda tape, x: second(tape, first(tape, x)), emit)

        def walk(tape: Tape, x: Any) -> Any:
            for step in walks:
                x = step(tape, x)
            return x

        return Walker(t, walk, emit)

    def __repr__(self) -> str:
        return f"Pipe({', '.join(map(repr, self.blocks))})"


class Record(Block):
    """Applies one child block per field of a dict, list or tuple; returns a tuple.

    A dict's fields are read as ``x[key]`` in the dict's order (insertion order, where
    TensorFlow Fold sorted the keys); a list or tuple's as ``x[i]``, and its input may also be
    a tuple type. Python dicts, lists and tuples of blocks convert to a ``Record``.

    Example:
        >>> from batchfold.blocks import Identity, Scalar
        >>> Record({"a": Scalar(), "b": Identity()}).eval({"a": 2.0, "b": "text"})
        (tensor(2.), 'text')
    """

    def __init__(self, children: Mapping[Any, Any] | Sequence[Any]) -> None:
        self.is_dict = isinstance(children, Mapping)
        if isinstance(children, Mapping):
            self.keys: list[Any] = list(children)
            self.children = [convert_to_block(children[k]) for k in self.keys]
        else:
            self.keys = list(range(len(children)))
            self.children = [convert_to_block(c) for c in children]
        wanted = [c.in_type for c in self.children]
        if self.is_dict:
            self.in_type = PyObjectType()
        elif all(t is not None for t in wanted):
            self.in_type = canonical(TupleType(*[t for t in wanted if t is not None]))
        self._check()

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        n = len(self.children)
        if isinstance(in_type, TupleType) and not self.is_dict and len(in_type.items) == n:
            item_types = list(in_type.items)
        elif isinstance(in_type, PyObjectType):
            item_types = [in_type] * n
        else:
            shape = "a Python dict" if self.is_dict else f"a Python object or a tuple of {n}"
            raise BlockTypeError(self, path, shape, in_type)
        walkers = [
            ctx.child(child, t, f"{path}[{key!r}]")
            for key, child, t in zip(self.keys, self.children, item_types, strict=True)
        ]
        pairs = [(walker.walk, key) for walker, key in zip(walkers, self.keys, strict=True)]
        block, check_len = self, isinstance(in_type, PyObjectType) and not self.is_dict
        known = isinstance(in_type, TupleType)  # a tuple of values: its items need no checks

        def fail_length(tape: Tape, x: Any) -> Exception:
            got = f"{_length(x)}" if _length(x) >= 0 else short(x, 40)
            return tape.fail(block, path, f"expected {n} fields, got {got}")

        def fail_field(tape: Tape, key: Any, error: BaseException) -> Exception:
            return tape.fail(block, path, f"cannot read field {key!r}: {error!r}")

        def emit(em: Emitter, x: Symbol) -> Symbol:
            if known:
                return tuple(em.value(w, em.item(x, i)) for i, w in enumerate(walkers))
            if check_len:
                with em.indented(f"if {em.const(_length, 'n')}({em.expr(x)}) != {n}:"):
                    em.line(f"raise {em.const(fail_length, 'f')}(tape, {em.expr(x)})")
            return tuple(
                em.value(w, em.read(x, key, fail_field))
                for key, w in zip(self.keys, walkers, strict=True)
            )

        def walk(tape: Tape, x: Any) -> tuple[Any, ...]:
            if check_len and _length(x) != n:
                raise fail_length(tape, x)
            result = []
            for step, key in pairs:
                try:
                    item = x[key]
                except (KeyError, IndexError, TypeError) as error:
                    raise tape.fail(block, path, f"cannot read field {key!r}: {error!r}") from None
                result.append(step(tape, item))
            return tuple(result)

        return Walker(canonical(TupleType(*[w.out_type for w in walkers])), walk, emit)

    def __repr__(self) -> str:
        if self.is_dict:
            inner = ", ".join(
                f"{k!r}: {c!r}" for k, c in zip(self.keys, self.children, strict=True)
            )
            return f"Record({{{inner}}})"
        trail = "," if len(self.children) == 1 else ""
        return f"Record(({', '.join(map(repr, self.children))}{trail}))"


class AllOf(Block):
    """Fan-out: every child block gets the same input; returns the tuple of their outputs.

    Example:
        >>> from batchfold.blocks import Identity, Scalar
        >>> AllOf(Scalar(), Identity()).eval(3)
        (tensor(3.), 3)
    """

    def __init__(self, *blocks: Any) -> None:
        self.blocks = tuple(convert_to_block(b) for b in blocks)
        fixed = [b.in_type for b in self.blocks if b.in_type is not None]
        self.in_type = fixed[0] if fixed else None
        self._check()

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        walkers = [ctx.child(b, in_type, f"{path}[{i}]") for i, b in enumerate(self.blocks)]
        if not walkers:
            return Walker(VoidType(), lambda tape, x: None)
        walks = [w.walk for w in walkers]

        def walk(tape: Tape, x: Any) -> tuple[Any, ...]:
            return tuple([step(tape, x) for step in walks])

        return Walker(canonical(TupleType(*[w.out_type for w in walkers])), walk)

    def __repr__(self) -> str:
        return f"AllOf({', '.join(map(repr, self.blocks))})"


class Void(Block):
    """Accepts any input and gives nothing (``VoidType``).

    Example:
        >>> print(Void().output_type(PyObjectType()))
        VoidType()
    """

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        return Walker(VoidType(), lambda tape, x: None)

    def __repr__(self) -> str:
        return "Void()"


class Metric(Block):
    """Sends a tensor (or a ``(tensor, label)`` pair) to the named metric; gives nothing.

    Values sent from anywhere in the model, recursion included, come back stacked into one
    tensor per metric (``model(inputs)[1][name]``); labels, any Python objects, come back
    in the plan (``plan.labels[name]``).

    Example:
        >>> from batchfold.blocks import Map, Scalar
        >>> Map(Scalar() >> Metric("x")).eval([1.0, 2.0])
        ([None, None], {'x': tensor([1., 2.])})
    """

    def __init__(self, name: str) -> None:
        self.name = name

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        labeled = (
            isinstance(in_type, TupleType)
            and len(in_type.items) == 2
            and isinstance(in_type.items[0], TensorType)
            and isinstance(in_type.items[1], PyObjectType)
        )
        value_type = in_type.items[0] if labeled else in_type  # type: ignore[union-attr]
        if not isinstance(value_type, TensorType):
            raise BlockTypeError(self, path, "a tensor or a (tensor, Python label) tuple", in_type)
        ctx.metric(self.name, value_type, self, path)
        name = self.name

        def walk(tape: Tape, x: Any) -> None:
            value, label = x if labeled else (x, None)
            tape.metrics[name].append(value)
            tape.labels[name].append(label)
            tape.metric_instances[name].append(tape.instance)

        def emit(em: Emitter, x: Symbol) -> Symbol:
            value, label = (em.item(x, 0), em.item(x, 1)) if labeled else (x, None)
            key = em.const(name)
            em.line(f"tape.metrics[{key}].append({em.expr(value)})")
            em.line(f"tape.labels[{key}].append({em.expr(label)})")
            em.line(f"tape.metric_instances[{key}].append(tape.instance)")
            return None

        return Walker(VoidType(), walk, emit)

    def __repr__(self) -> str:
        return f"Metric({self.name!r})"


register_converter(dict, list, tuple)(Record)
constructors.pipe = Pipe

__all__ = [
    "AllOf",
    "Metric",
    "OneOf",
    "Optional",
    "Pipe",
    "Record",
    "Void",
]


def _length(x: Any) -> int:
    """``len(x)``, or -1 for a value without one (a number given where fields are expected)."""
    try:
        return len(x)
    except TypeError:
        return -1
