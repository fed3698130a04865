"""Blocks from a sequence to one tensor: ``Sum``, ``Min``, ``Max``, ``Mean``, ``Pad`` and
``Length``.

``Sum``, ``Min`` and ``Max`` are a balanced :class:`~batchfold.blocks.sequence_loops.Reduce`
with an element-wise op; ``Mean`` divides the sum by the length; ``Pad`` stacks the items
into ``[length, *shape]``, padded with zero rows; ``Length`` gives the number of items.
"""

from __future__ import annotations

from typing import Any

import torch

from ..graph import Signature
from ..ops import OpRule
from .base import Block
from .constants import Zeros
from .function import Function
from .sequence_loops import Reduce, element_type, sequence_items
from .tensors import as_dtype
from .types import BlockTypeError, TensorType, Type, VoidType
from .walker import OpSpec, Specializer, Tape, Walker


class _ElementwiseReduce(Block):
    """``Reduce`` with an element-wise op on a sequence of tensors (zeros when empty)."""

    op: Any = None

    def __init__(self) -> None:
        self.reduce = Reduce(Function(type(self).op, name=type(self).__name__.lower()))

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        elem, _ = element_type(self, in_type, path)
        if not isinstance(elem, TensorType):
            raise BlockTypeError(self, path, "a sequence of tensors", in_type)
        return ctx.child(self.reduce, in_type, path)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Sum(_ElementwiseReduce):
    """The sum of a sequence of tensors (zeros when empty), as a balanced ``Reduce``.

    Example:
        >>> from batchfold.blocks import Map, Scalar
        >>> (Map(Scalar()) >> Sum()).eval([1.0, 2.0, 3.0])
        tensor(6.)
    """

    op = torch.add


class Min(_ElementwiseReduce):
    """The element-wise minimum of a sequence of tensors (zeros when empty).

    Example:
        >>> from batchfold.blocks import Map, Scalar
        >>> (Map(Scalar()) >> Min()).eval([4.0, 2.0, 3.0])
        tensor(2.)
    """

    op = torch.minimum


class Max(_ElementwiseReduce):
    """The element-wise maximum of a sequence of tensors (zeros when empty).

    Example:
        >>> from batchfold.blocks import Map, Scalar
        >>> (Map(Scalar()) >> Max()).eval([4.0, 2.0, 3.0])
        tensor(4.)
    """

    op = torch.maximum


def _divide(sig: Signature, inputs: list[torch.Tensor], n: int) -> torch.Tensor:
    total, count = inputs
    # the count is float32 (or float64) and half precision divides at float32, as ``total /
    # len(items)`` does eagerly: a half-precision count is inf past 65,504 items
    quotient = total.to(count.dtype) / count.reshape(n, *[1] * (total.dim() - 1))
    return quotient.to(total.dtype)


class Mean(Block):
    """The mean of a sequence of floating tensors: ``Sum`` over the length (zeros when empty).

    Example:
        >>> from batchfold.blocks import Map, Scalar
        >>> (Map(Scalar()) >> Mean()).eval([1.0, 2.0, 6.0])
        tensor(3.)
    """

    def __init__(self) -> None:
        self.sum = Sum()

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        elem, _ = element_type(self, in_type, path)
        if not (isinstance(elem, TensorType) and elem.dtype.is_floating_point):
            raise BlockTypeError(self, path, "a sequence of floating-point tensors", in_type)
        total = ctx.child(self.sum, in_type, path).walk
        scalar = TensorType((), torch.promote_types(elem.dtype, torch.float32))
        count = ctx.spec(OpSpec("length", path, (), (scalar,), source="scalar"))
        rule = OpRule("mean", _divide)
        divide = ctx.spec(OpSpec("mean", path, (elem, scalar), (elem,), rule, torch.div))

        block = self

        def walk(tape: Tape, x: Any) -> int:
            items = sequence_items(tape, block, path, x)
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
        >>> from batchfold.blocks import Map, Scalar
        >>> (Map(Scalar()) >> Pad(3)).eval([1.0, 2.0])
        tensor([1., 2., 0.])
    """

    def __init__(self, length: int) -> None:
        if length < 1:
            raise ValueError(f"Pad needs a length >= 1, got {length}")
        self.length = length

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        elem, _ = element_type(self, in_type, path)
        if not isinstance(elem, TensorType):
            raise BlockTypeError(self, path, "a sequence of tensors", in_type)
        length, block = self.length, self
        out = TensorType((length, *elem.shape), elem.dtype)
        padding = ctx.child(Zeros(elem), VoidType(), f"{path}.padding").walk
        rule = OpRule("pad", _stack, cheap=True)
        spec = ctx.spec(OpSpec(f"pad{length}", path, (elem,) * length, (out,), rule, torch.stack))

        def walk(tape: Tape, x: Any) -> int:
            items = sequence_items(tape, block, path, x)
            if len(items) > length:
                raise tape.fail(block, path, f"got {len(items)} items, more than {length}")
            if len(items) < length:
                items = items + [padding(tape, None)] * (length - len(items))
            return tape.add(spec, items)

        return Walker(out, walk)

    def __repr__(self) -> str:
        return f"Pad({self.length})"


class Length(Block):
    """The length of a sequence as a 0-d tensor (default dtype unless ``dtype`` is given).

    Example:
        >>> Length("int64").eval([5, 6, 7])
        tensor(3)
    """

    def __init__(self, dtype: torch.dtype | str | None = None) -> None:
        self.dtype = as_dtype(dtype)

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        element_type(self, in_type, path)
        t = TensorType((), self.dtype)
        spec = ctx.spec(OpSpec("length", path, (), (t,), source="scalar"))
        block = self
        return Walker(
            t, lambda tape, x: tape.source(spec, len(sequence_items(tape, block, path, x)))
        )

    def __repr__(self) -> str:
        return f"Length({self.dtype})"


__all__ = ["Length", "Max", "Mean", "Min", "Pad", "Sum"]
