"""Blocks over sequences: ``Map``, ``Fold``, ``RNN``, ``Reduce`` (and ``Sum``, ``Min``,
``Max``, ``Mean``), ``Broadcast``, ``Zip``, ``ZipWith``, ``NGrams``, ``Nth`` and ``Length``.

A sequence is a Python list at walk time (a Python iterable where the type is a Python
object); a broadcast sequence is a :class:`Repeat`. The loops of these blocks run while
recording, so a fold over ``n`` items records ``n`` nodes, ``n`` deep, and ``Reduce`` records
``log2 n`` levels.

This module holds the blocks that rearrange sequences (``Broadcast``, ``Zip``, ``ZipWith``,
``NGrams``, ``Nth``) and re-exports the others: the blocks that apply a block along a
sequence are in :mod:`batchfold.blocks.sequence_loops`, those that turn a sequence into one
tensor in :mod:`batchfold.blocks.sequence_tensors`.
"""

from __future__ import annotations

from typing import Any

from .base import Block
from .convert import convert_to_block
from .sequence_loops import RNN, Fold, Map, Reduce, Repeat, element_type, sequence_items
from .sequence_tensors import Length, Max, Mean, Min, Pad, Sum
from .types import (
    BlockTypeError,
    BroadcastSequenceType,
    PyObjectType,
    SequenceType,
    TupleType,
    Type,
    canonical,
)
from .walker import Specializer, Tape, Walker


def _as_list(x: Any) -> list[Any]:
    return x if type(x) is list else list(x)


class Broadcast(Block):
    """A value as an endless sequence repeating it (for ``Zip`` with finite sequences).

    Example:
        >>> from batchfold.blocks import Identity, Record
        >>> (Record((Broadcast(), Identity())) >> Zip()).eval((0, [1, 2]))
        [(0, 1), (0, 2)]
    """

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        return Walker(canonical(BroadcastSequenceType(in_type)), lambda tape, x: Repeat(x))

    def __repr__(self) -> str:
        return "Broadcast()"


class Zip(Block):
    """A tuple of sequences -> a sequence of tuples, as long as the shortest finite one.

    Example:
        >>> Zip().eval(([1, 2, 3], "ab"))
        [(1, 'a'), (2, 'b')]
    """

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        block = self

        def walk(tape: Tape, x: Any) -> list[tuple[Any, ...]]:
            parts = sequence_items(tape, block, path, x)
            seqs: list[Any] = [
                s if type(s) is Repeat else sequence_items(tape, block, path, s) for s in parts
            ]
            finite = [len(s) for s in seqs if type(s) is not Repeat]
            if not finite:
                raise tape.fail(
                    block, path, "expected at least one sequence that is not a Broadcast"
                )
            n = min(finite)
            return [tuple([s.value if type(s) is Repeat else s[i] for s in seqs]) for i in range(n)]

        if isinstance(in_type, PyObjectType):
            return Walker(in_type, walk)
        if not isinstance(in_type, TupleType) or not in_type.items:
            raise BlockTypeError(self, path, "a tuple of sequences", in_type)
        elems = [element_type(self, t, path, finite=False) for t in in_type.items]
        if all(repeat for _, repeat in elems):
            raise BlockTypeError(self, path, "at least one finite sequence", in_type)
        return Walker(canonical(SequenceType(TupleType(*[e for e, _ in elems]))), walk)

    def __repr__(self) -> str:
        return "Zip()"


class ZipWith(Block):
    """``Zip() >> Map(block)``: applies ``block`` to the tuples of a zip.

    Example:
        >>> import torch
        >>> from batchfold.blocks import Function, Record, Scalar
        >>> add = ZipWith(Record((Scalar(), Scalar())) >> Function(torch.add))
        >>> add.eval(([1.0, 2.0], [10.0, 20.0]))
        [tensor(11.), tensor(22.)]
    """

    def __init__(self, block: Any) -> None:
        self.block = convert_to_block(block)
        self.pipe = Zip() >> Map(self.block)

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        return ctx.child(self.pipe, in_type, path)

    def __repr__(self) -> str:
        return f"ZipWith({self.block!r})"


class NGrams(Block):
    """A sequence -> the sequence of its ``n``-tuples of consecutive elements.

    Example:
        >>> NGrams(2).eval([1, 2, 3])
        [(1, 2), (2, 3)]
    """

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"NGrams needs n >= 1, got {n}")
        self.n = n

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        elem, _ = element_type(self, in_type, path)
        n, block = self.n, self

        def walk(tape: Tape, x: Any) -> list[tuple[Any, ...]]:
            items = sequence_items(tape, block, path, x)
            return [tuple(items[i : i + n]) for i in range(len(items) - n + 1)]

        return Walker(canonical(SequenceType(TupleType(*[elem] * n))), walk)

    def __repr__(self) -> str:
        return f"NGrams({self.n})"


class Nth(Block):
    """``(sequence, n) -> sequence[n]``, with ``n`` a Python int.

    Example:
        >>> Nth().eval((["a", "b", "c"], 1))
        'b'
    """

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        if isinstance(in_type, PyObjectType):
            elem: Type = in_type
        elif isinstance(in_type, TupleType) and len(in_type.items) == 2:
            elem, _ = element_type(self, in_type.items[0], path)
            if not isinstance(in_type.items[1], PyObjectType):
                raise BlockTypeError(self, path, "a tuple (sequence, Python int)", in_type)
        else:
            raise BlockTypeError(self, path, "a tuple (sequence, Python int)", in_type)
        block = self

        def walk(tape: Tape, x: Any) -> Any:
            seq, n = x
            try:
                return _as_list(seq)[n]
            except (IndexError, TypeError) as error:
                raise tape.fail(block, path, f"cannot take item {n!r}: {error}") from None

        return Walker(elem, walk)

    def __repr__(self) -> str:
        return "Nth()"


__all__ = [
    "Broadcast",
    "Fold",
    "Length",
    "Map",
    "Max",
    "Mean",
    "Min",
    "NGrams",
    "Nth",
    "Pad",
    "RNN",
    "Reduce",
    "Repeat",
    "Sum",
    "Zip",
    "ZipWith",
]
