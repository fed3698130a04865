"""Blocks over sequences: ``Map``, ``Fold``, ``RNN``, ``Reduce`` (and ``Sum``, ``Min``,
``Max``, ``Mean``), ``Broadcast``, ``Zip``, ``ZipWith``, ``NGrams``, ``Nth`` and ``Length``.

A sequence is a Python list at walk time (a Python iterable where the type is a Python
object); a broadcast sequence is a :class:`Repeat`. The loops here run while recording, so a
fold over ``n`` items records ``n`` nodes, ``n`` deep, and ``Reduce`` records ``log2 n`` levels.
"""

from __future__ import annotations

from typing import Any

import torch

from ..graph import Signature
from ..ops import OpRule
from .base import Block
from .convert import convert_to_block
from .function import Function
from .tensors import Zeros, as_dtype
from .types import (
    BlockTypeError,
    BroadcastSequenceType,
    PyObjectType,
    SequenceType,
    TensorType,
    TupleType,
    Type,
    VoidType,
    canonical,
    short,
)
from .walker import OpSpec, Specializer, Tape, Walker


class Repeat:
    """The value of a broadcast sequence: ``value`` repeated without end."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"Repeat({self.value!r})"


def _elem(block: Block, t: Type, path: str, finite: bool = True) -> tuple[Type, bool]:
    """The element type of a sequence type, and whether it is a broadcast sequence."""
    if isinstance(t, PyObjectType):
        return t, False
    if isinstance(t, SequenceType):
        return t.elem, False
    if isinstance(t, BroadcastSequenceType) and not finite:
        return t.elem, True
    kind = "a sequence" if finite else "a sequence or a broadcast sequence"
    raise BlockTypeError(block, path, kind, t)


def _as_list(x: Any) -> list[Any]:
    return x if type(x) is list else list(x)


def _listed(tape: Tape, block: Block, path: str, x: Any) -> list[Any]:
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
        elem, repeat = _elem(self, in_type, path, finite=False)
        walker = ctx.child(self.block, elem, f"{path}.block")
        step = walker.walk
        if repeat:
            out: Type = BroadcastSequenceType(walker.out_type)
            return Walker(out, lambda tape, x: Repeat(step(tape, x.value)))
        block = self
        return Walker(
            canonical(SequenceType(walker.out_type)),
            lambda tape, x: [step(tape, item) for item in _listed(tape, block, path, x)],
        )

    def __repr__(self) -> str:
        return f"Map({self.block!r})"


class Fold(Block):
    """Left fold: ``state = combine((state, x))`` for each element, from ``start()``.

    Arguments:
        combine: a block from ``(state, element)`` to the next state.
        start: a block from no input (void) to the first state, e.g. ``Zeros(type)``.

    Example:
        >>> from batchfold.blocks import Scalar
        >>> f = Map(Scalar()) >> Fold(Function(torch.maximum), Zeros(TensorType((), torch.float32)))
        >>> f.eval([3.0, -1.0, 5.0])
        tensor(5.)
    """

    def __init__(self, combine: Any, start: Any) -> None:
        self.combine, self.start = convert_to_block(combine), convert_to_block(start)
        self._check()

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        elem, _ = _elem(self, in_type, path)
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
            for item in _listed(tape, block, path, x):
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
        >>> from batchfold.blocks import Scalar
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
            elem, _ = _elem(self, in_type.items[0], path)
            state, first = in_type.items[1], None
        else:
            elem, _ = _elem(self, in_type, path)
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
            for item in _listed(tape, block, path, seq):
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
        >>> from batchfold.blocks import Scalar
        >>> (Map(Scalar()) >> Reduce(Function(torch.mul))).eval([2.0, 3.0, 4.0])
        tensor(24.)
    """

    def __init__(self, combine: Any, default: Any = None) -> None:
        self.combine = convert_to_block(combine)
        self.default = convert_to_block(default) if default is not None else None
        self._check()

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        elem, _ = _elem(self, in_type, path)
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
            items = _listed(tape, block, path, x)
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


class _ElementwiseReduce(Block):
    """``Reduce`` with an element-wise op on a sequence of tensors (zeros when empty)."""

    op: Any = None

    def __init__(self) -> None:
        self.reduce = Reduce(Function(type(self).op, name=type(self).__name__.lower()))

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        elem, _ = _elem(self, in_type, path)
        if not isinstance(elem, TensorType):
            raise BlockTypeError(self, path, "a sequence of tensors", in_type)
        return ctx.child(self.reduce, in_type, path)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Sum(_ElementwiseReduce):
    """The sum of a sequence of tensors (zeros when empty), as a balanced ``Reduce``.

    Example:
        >>> from batchfold.blocks import Scalar
        >>> (Map(Scalar()) >> Sum()).eval([1.0, 2.0, 3.0])
        tensor(6.)
    """

    op = torch.add


class Min(_ElementwiseReduce):
    """The element-wise minimum of a sequence of tensors (zeros when empty).

    Example:
        >>> from batchfold.blocks import Scalar
        >>> (Map(Scalar()) >> Min()).eval([4.0, 2.0, 3.0])
        tensor(2.)
    """

    op = torch.minimum


class Max(_ElementwiseReduce):
    """The element-wise maximum of a sequence of tensors (zeros when empty).

    Example:
        >>> from batchfold.blocks import Scalar
        >>> (Map(Scalar()) >> Max()).eval([4.0, 2.0, 3.0])
        tensor(4.)
    """

    op = torch.maximum


def _divide(sig: Signature, inputs: list[torch.Tensor], n: int) -> torch.Tensor:
    total, count = inputs
    return total / count.reshape(n, *[1] * (total.dim() - 1))


class Mean(Block):
    """The mean of a sequence of floating tensors: ``Sum`` over the length (zeros when empty).

    Example:
        >>> from batchfold.blocks import Scalar
        >>> (Map(Scalar()) >> Mean()).eval([1.0, 2.0, 6.0])
        tensor(3.)
    """

    def __init__(self) -> None:
        self.sum = Sum()

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        elem, _ = _elem(self, in_type, path)
        if not (isinstance(elem, TensorType) and elem.dtype.is_floating_point):
            raise BlockTypeError(self, path, "a sequence of floating-point tensors", in_type)
        total = ctx.child(self.sum, in_type, path).walk
        scalar = TensorType((), elem.dtype)
        count = ctx.spec(OpSpec("length", path, (), (scalar,), source="scalar"))
        rule = OpRule("mean", _divide)
        divide = ctx.spec(OpSpec("mean", path, (elem, scalar), (elem,), rule, torch.div))

        block = self

        def walk(tape: Tape, x: Any) -> int:
            items = _listed(tape, block, path, x)
            total_id = total(tape, items)
            return tape.add(divide, (total_id, tape.source(count, max(len(items), 1))))

        return Walker(elem, walk)

    def __repr__(self) -> str:
        return "Mean()"


def _stack(sig: Signature, inputs: list[torch.Tensor], n: int) -> torch.Tensor:
    return torch.stack(inputs, dim=1)


class Pad(Block):
    """A sequence of tensors -> one tensor ``[length, *shape]``, padded with zero rows.

    Use ``Length`` alongside it for the true lengths; a longer sequence is an input error.

    Example:
        >>> from batchfold.blocks import Scalar
        >>> (Map(Scalar()) >> Pad(3)).eval([1.0, 2.0])
        tensor([1., 2., 0.])
    """

    def __init__(self, length: int) -> None:
        if length < 1:
            raise ValueError(f"Pad needs a length >= 1, got {length}")
        self.length = length

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        elem, _ = _elem(self, in_type, path)
        if not isinstance(elem, TensorType):
            raise BlockTypeError(self, path, "a sequence of tensors", in_type)
        length, block = self.length, self
        out = TensorType((length, *elem.shape), elem.dtype)
        padding = ctx.child(Zeros(elem), VoidType(), f"{path}.padding").walk
        rule = OpRule("pad", _stack, cheap=True)
        spec = ctx.spec(OpSpec(f"pad{length}", path, (elem,) * length, (out,), rule, torch.stack))

        def walk(tape: Tape, x: Any) -> int:
            items = _listed(tape, block, path, x)
            if len(items) > length:
                raise tape.fail(block, path, f"got {len(items)} items, more than {length}")
            if len(items) < length:
                items = items + [padding(tape, None)] * (length - len(items))
            return tape.add(spec, items)

        return Walker(out, walk)

    def __repr__(self) -> str:
        return f"Pad({self.length})"


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
        if isinstance(in_type, PyObjectType):
            return Walker(in_type, _zip_walk)
        if not isinstance(in_type, TupleType) or not in_type.items:
            raise BlockTypeError(self, path, "a tuple of sequences", in_type)
        elems = [_elem(self, t, path, finite=False) for t in in_type.items]
        if all(repeat for _, repeat in elems):
            raise BlockTypeError(self, path, "at least one finite sequence", in_type)
        return Walker(canonical(SequenceType(TupleType(*[e for e, _ in elems]))), _zip_walk)

    def __repr__(self) -> str:
        return "Zip()"


def _zip_walk(tape: Tape, x: Any) -> list[tuple[Any, ...]]:
    seqs: list[Any] = [s if type(s) is Repeat else _as_list(s) for s in x]
    n = min([len(s) for s in seqs if type(s) is not Repeat])
    return [tuple([s.value if type(s) is Repeat else s[i] for s in seqs]) for i in range(n)]


class ZipWith(Block):
    """``Zip() >> Map(block)``: applies ``block`` to the tuples of a zip.

    Example:
        >>> from batchfold.blocks import Record, Scalar
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
        elem, _ = _elem(self, in_type, path)
        n, block = self.n, self

        def walk(tape: Tape, x: Any) -> list[tuple[Any, ...]]:
            items = _listed(tape, block, path, x)
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
            elem, _ = _elem(self, in_type.items[0], path)
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


class Length(Block):
    """The length of a sequence as a 0-d tensor (default dtype unless ``dtype`` is given).

    Example:
        >>> Length("int64").eval([5, 6, 7])
        tensor(3)
    """

    def __init__(self, dtype: torch.dtype | str | None = None) -> None:
        self.dtype = as_dtype(dtype)

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        _elem(self, in_type, path)
        t = TensorType((), self.dtype)
        spec = ctx.spec(OpSpec("length", path, (), (t,), source="scalar"))
        block = self
        return Walker(t, lambda tape, x: tape.source(spec, len(_listed(tape, block, path, x))))

    def __repr__(self) -> str:
        return f"Length({self.dtype})"


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
