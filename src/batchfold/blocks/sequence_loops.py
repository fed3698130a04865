"""Blocks that apply a block along a sequence: ``Map``, ``Fold``, ``RNN`` and ``Reduce``.

Also :class:`Repeat` (the value of a broadcast sequence) and the helpers every sequence block
uses to check its input type and read its items. The loops here run while recording, so a
fold over ``n`` items records ``n`` nodes, ``n`` deep, and ``Reduce`` records ``log2 n`` levels.
"""

from __future__ import annotations

from typing import Any

from .base import Block
from .constants import Zeros
from .convert import convert_to_block
from .types import (
    BlockTypeError,
    BroadcastSequenceType,
    PyObjectType,
    SequenceType,
    TupleType,
    Type,
    VoidType,
    canonical,
    short,
)
from .walker import Specializer, Tape, Walker


class Repeat:
    """The value of a broadcast sequence: ``value`` repeated without end."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"Repeat({self.value!r})"


def element_type(block: Block, t: Type, path: str, finite: bool = True) -> tuple[Type, bool]:
    """The element type of a sequence type, and whether it is a broadcast sequence."""
    if isinstance(t, PyObjectType):
        return t, False
    if isinstance(t, SequenceType):
        return t.elem, False
    if isinstance(t, BroadcastSequenceType) and not finite:
        return t.elem, True
    kind = "a sequence" if finite else "a sequence or a broadcast sequence"
    raise BlockTypeError(block, path, kind, t)


def sequence_items(tape: Tape, block: Block, path: str, x: Any) -> list[Any]:
    """``x`` as a list, or a clear error naming the block when it is not a sequence."""
    if type(x) is list:
        return x
    try:
        return list(x)
    except TypeError:
        raise tape.fail(block, path, f"expected a sequence, got {short(x, 60)}") from None


class Map(Block):
    """Applies a block to every element of a sequence (or once to a broadcast sequence).

    Example:
        >>> from batchfold.blocks import Scalar
        >>> Map(Scalar("int64")).eval([1, 2])
        [tensor(1), tensor(2)]
    """

    def __init__(self, block: Any) -> None:
        self.block = convert_to_block(block)
        inner = self.block.in_type
        self.in_type = canonical(SequenceType(inner)) if inner is not None else None
        self._check()

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        elem, repeat = element_type(self, in_type, path, finite=False)
        walker = ctx.child(self.block, elem, f"{path}.block")
        step = walker.walk
        if repeat:
            out: Type = BroadcastSequenceType(walker.out_type)
            return Walker(out, lambda tape, x: Repeat(step(tape, x.value)))
        block = self
        return Walker(
            canonical(SequenceType(walker.out_type)),
            lambda tape, x: [step(tape, item) for item in sequence_items(tape, block, path, x)],
        )

    def __repr__(self) -> str:
        return f"Map({self.block!r})"


class Fold(Block):
    """Left fold: ``state = combine((state, x))`` for each element, from ``start()``.

    Arguments:
        combine: a block from ``(state, element)`` to the next state.
        start: a block from no input (void) to the first state, e.g. ``Zeros(type)``.

    Example:
        >>> import torch
        >>> from batchfold.blocks import Function, Scalar, TensorType
        >>> f = Map(Scalar()) >> Fold(Function(torch.maximum), Zeros(TensorType((), torch.float32)))
        >>> f.eval([3.0, -1.0, 5.0])
        tensor(5.)
    """

    def __init__(self, combine: Any, start: Any) -> None:
        self.combine, self.start = convert_to_block(combine), convert_to_block(start)
        self._check()

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        elem, _ = element_type(self, in_type, path)
        start = ctx.child(self.start, VoidType(), f"{path}.start")
        state = start.out_type
        combine = ctx.child(self.combine, canonical(TupleType(state, elem)), f"{path}.combine")
        if combine.out_type != state:
            raise BlockTypeError(
                self.combine,
                f"{path}.combine",
                f"to give the state type {state!r} (what start gives)",
                combine.out_type,
                verb="is",
            )
        first, step, block = start.walk, combine.walk, self

        def walk(tape: Tape, x: Any) -> Any:
            acc = first(tape, None)
            for item in sequence_items(tape, block, path, x):
                acc = step(tape, (acc, item))
            return acc

        return Walker(state, walk)

    def __repr__(self) -> str:
        return f"Fold({self.combine!r}, {self.start!r})"


class RNN(Block):
    """Runs a cell ``(x, state) -> (y, state)`` along a sequence; gives ``(ys, final_state)``.

    The first state is ``initial_state()`` (default: zeros of the state type the cell's
    declared ``in_type`` names), or, with ``initial_state_from_input``, the second item of an
    input ``(sequence, state)``.

    Example:
        >>> import torch
        >>> from batchfold.blocks import Function, Scalar, TensorType
        >>> t = TensorType((), torch.float32)
        >>> cell = Function(lambda x, s: (x + s, x + s), in_type=TupleType(t, t))
        >>> ys, last = (Map(Scalar()) >> RNN(cell)).eval([1.0, 2.0, 3.0])
        >>> [float(y) for y in ys], float(last)
        ([1.0, 3.0, 6.0], 6.0)
    """

    def __init__(
        self, cell: Any, initial_state: Any = None, initial_state_from_input: bool = False
    ) -> None:
        if initial_state is not None and initial_state_from_input:
            raise ValueError("give initial_state or initial_state_from_input, not both")
        self.cell = convert_to_block(cell)
        self.initial_state = convert_to_block(initial_state) if initial_state is not None else None
        self.from_input = initial_state_from_input
        self._check()

    def _state_type(self, in_type: Type, ctx: Specializer, path: str) -> tuple[Type, Any]:
        if self.initial_state is not None:
            start = ctx.child(self.initial_state, VoidType(), f"{path}.initial_state")
            return start.out_type, start.walk
        declared = self.cell.in_type
        if not (isinstance(declared, TupleType) and len(declared.items) == 2):
            raise BlockTypeError(
                self,
                path,
                "a cell with a declared in_type (x, state), or an initial_state block",
                None,
                verb="needs",
            )
        state = declared.items[1]
        return state, ctx.child(Zeros(state), VoidType(), f"{path}.initial_state").walk

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        if self.from_input:
            if not (isinstance(in_type, TupleType) and len(in_type.items) == 2):
                raise BlockTypeError(self, path, "a tuple (sequence, initial state)", in_type)
            elem, _ = element_type(self, in_type.items[0], path)
            state, first = in_type.items[1], None
        else:
            elem, _ = element_type(self, in_type, path)
            state, first = self._state_type(in_type, ctx, path)
        cell = ctx.child(self.cell, canonical(TupleType(elem, state)), f"{path}.cell")
        out = cell.out_type
        if not (isinstance(out, TupleType) and len(out.items) == 2 and out.items[1] == state):
            raise BlockTypeError(
                self.cell, f"{path}.cell", f"to give a tuple (y, {state!r})", out, verb="is"
            )
        step, block = cell.walk, self

        def walk(tape: Tape, x: Any) -> tuple[list[Any], Any]:
            seq, h = x if first is None else (x, first(tape, None))
            ys = []
            for item in sequence_items(tape, block, path, seq):
                y, h = step(tape, (item, h))
                ys.append(y)
            return ys, h

        return Walker(canonical(TupleType(canonical(SequenceType(out.items[0])), state)), walk)

    def __repr__(self) -> str:
        init = f", {self.initial_state!r}" if self.initial_state is not None else ""
        flag = ", initial_state_from_input=True" if self.from_input else ""
        return f"RNN({self.cell!r}{init}{flag})"


class Reduce(Block):
    """Combines a sequence pairwise as a balanced tree, ``log2 n`` deep; empty gives ``default``.

    Each round combines items ``(0, 1), (2, 3), ...``; an odd last item waits for the next round.

    Example:
        >>> import torch
        >>> from batchfold.blocks import Function, Scalar
        >>> (Map(Scalar()) >> Reduce(Function(torch.mul))).eval([2.0, 3.0, 4.0])
        tensor(24.)
    """

    def __init__(self, combine: Any, default: Any = None) -> None:
        self.combine = convert_to_block(combine)
        self.default = convert_to_block(default) if default is not None else None
        self._check()

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        elem, _ = element_type(self, in_type, path)
        combine = ctx.child(self.combine, canonical(TupleType(elem, elem)), f"{path}.combine")
        if combine.out_type != elem:
            raise BlockTypeError(
                self.combine, f"{path}.combine", f"to give {elem!r}", combine.out_type, verb="is"
            )
        default_block = self.default if self.default is not None else Zeros(elem)
        default = ctx.child(default_block, VoidType(), f"{path}.default")
        if default.out_type != elem:
            raise BlockTypeError(
                default_block, f"{path}.default", f"to give {elem!r}", default.out_type, verb="is"
            )
        step, empty, block = combine.walk, default.walk, self

        def walk(tape: Tape, x: Any) -> Any:
            items = sequence_items(tape, block, path, x)
            if not items:
                return empty(tape, None)
            while len(items) > 1:
                paired = [step(tape, (items[i], items[i + 1])) for i in range(0, len(items) - 1, 2)]
                if len(items) % 2:
                    paired.append(items[-1])
                items = paired
            return items[0]

        return Walker(elem, walk)

    def __repr__(self) -> str:
        default = f", {self.default!r}" if self.default is not None else ""
        return f"Reduce({self.combine!r}{default})"


__all__ = ["RNN", "Fold", "Map", "Reduce", "Repeat", "element_type", "sequence_items"]
