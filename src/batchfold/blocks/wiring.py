"""Blocks wired by hand: ``Composition``, a DAG.

A composition traces a Python function that wires blocks with ``block.reads(wire)``.
(``ForwardDeclaration``, the other block wired by hand, is in :mod:`.recursion`.)
"""

from __future__ import annotations

from collections.abc import Callable
from operator import itemgetter
from typing import Any

from .base import Block
from .codegen import Emitter, Symbol
from .convert import constructors, convert_to_block
from .pyobjects import GetItem
from .types import TupleType, Type, VoidType, canonical, short
from .walker import Specializer, Tape, Walker


class Wire:
    """A value inside a :class:`Composition`'s wiring function (its input or a block's output).

    ``wire[i]`` selects an item of a tuple or sequence (a ``GetItem``).
    """

    __slots__ = ("trace", "index")

    def __init__(self, trace: _Trace, index: int) -> None:
        self.trace, self.index = trace, index

    def __getitem__(self, key: Any) -> Wire:
        return reads(GetItem(key), (self,))

    def __repr__(self) -> str:
        return f"Wire({self.index})"


class _Trace:
    """The nodes a wiring function made: ``(block, input structure)``, inputs by wire index."""

    def __init__(self) -> None:
        self.nodes: list[tuple[Block, Any]] = []

    def structure(self, value: Any) -> Any:
        if isinstance(value, Wire):
            if value.trace is not self:
                raise ValueError("a Wire was used outside the Composition that made it")
            return value.index
        if isinstance(value, (tuple, list)):
            return tuple(self.structure(item) for item in value)
        raise TypeError(f"a Composition wires Wires and tuples of them, got {short(value)}")


_TRACING: list[_Trace] = []


def reads(block: Block, wires: tuple[Any, ...]) -> Wire:
    """Add ``block`` to the Composition being wired, reading ``wires``; returns its output."""
    if not _TRACING:
        raise RuntimeError("block.reads(...) wires blocks inside a Composition's wiring function")
    trace = _TRACING[-1]
    source = trace.structure(wires[0] if len(wires) == 1 else wires)
    trace.nodes.append((convert_to_block(block), source))
    return Wire(trace, len(trace.nodes))


def _build(structure: Any, values: list[Any]) -> Any:
    if type(structure) is int:
        return values[structure]
    return tuple([_build(s, values) for s in structure])


def _getter(structure: Any) -> Callable[[list[Any]], Any]:
    """A fast function from the wire values to the value of ``structure``."""
    if type(structure) is int:
        return itemgetter(structure)
    if len(structure) > 1 and all(type(s) is int for s in structure):
        return itemgetter(*structure)  # gives the tuple of those values
    return lambda values: _build(structure, values)


class Composition(Block):
    """A DAG of blocks with explicit wiring, written as a function of the input wire.

    ``wiring(x)`` calls ``block.reads(wire, ...)`` to add each block (several wires are read
    as a tuple) and returns the output wire, a tuple of wires, or ``None`` (void). Blocks run
    in the order they were wired; every one runs, so a ``Metric`` needs no output.

    Arguments:
        wiring: the function that wires the blocks.
        input_type: the input type, when fixed.
        name: the name shown in ``repr``.

    Example:
        >>> from batchfold.blocks import Concat, Scalar
        >>> def wiring(x):
        ...     a = Scalar().reads(x[0])
        ...     return Concat().reads(a, a)
        >>> Composition(wiring).eval([2.0, "unused"])
        tensor([2., 2.])
    """

    def __init__(
        self,
        wiring: Callable[[Wire], Any],
        input_type: Type | None = None,
        name: str | None = None,
    ) -> None:
        trace = _Trace()
        _TRACING.append(trace)
        try:
            result = wiring(Wire(trace, 0))
        finally:
            _TRACING.pop()
        self.nodes = trace.nodes
        self.output = None if result is None else trace.structure(result)
        self.name = name or getattr(wiring, "__qualname__", "wiring")
        self.in_type = input_type
        self._check()

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        types: list[Type] = [in_type]

        def type_of(structure: Any) -> Type:
            if type(structure) is int:
                return types[structure]
            return canonical(TupleType(*[type_of(s) for s in structure]))

        steps, walkers = [], []
        for i, (block, source) in enumerate(self.nodes):
            walker = ctx.child(block, type_of(source), f"{path}.nodes[{i}]")
            types.append(walker.out_type)
            steps.append((walker.walk, _getter(source)))
            walkers.append((walker, source))
        output = self.output
        out_type = VoidType() if output is None else type_of(output)
        result = (lambda values: None) if output is None else _getter(output)

        def walk(tape: Tape, x: Any) -> Any:
            values = [x]
            for step, get in steps:
                values.append(step(tape, get(values)))
            return result(values)

        def emit(em: Emitter, x: Symbol) -> Symbol:
            values: list[Symbol] = [x]
            for walker, source in walkers:
                values.append(em.value(walker, _build(source, values)))
            return None if output is None else _build(output, values)

        return Walker(out_type, walk, emit)

    def __repr__(self) -> str:
        return f"Composition({self.name})"


constructors.reads = reads

__all__ = [
    "Composition",
    "Wire",
    "reads",
]
