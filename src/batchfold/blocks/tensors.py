"""Blocks that make tensors: inputs (``Scalar``, ``Vector``, ``Tensor``, ``OneHot``,
``OneHotFromList``) and ``Concat``; the constants ``FromTensor`` and ``Zeros`` are in
:mod:`batchfold.blocks.constants` and importable from here as well.

Input blocks record one *source* node per value; the executor builds the batch from the
Python numbers with one call. Constants are one node per batch, read by every instance.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..graph import Signature
from ..lazy import Lazy
from ..ops import OpRule
from .base import Block
from .codegen import Emitter, Symbol
from .constants import FromTensor, Zeros
from .function import call_walker
from .types import (
    BlockTypeError,
    PyObjectType,
    TensorType,
    TupleType,
    Type,
    flat_tensor_types,
    is_tensors,
    short,
)
from .walker import OpSpec, Specializer, Tape, Walker

_NUMBERS = (int, float, bool)


def as_dtype(dtype: torch.dtype | str | None) -> torch.dtype:
    """A ``torch.dtype`` from a dtype, its name (``"int64"``) or ``None`` (the default dtype)."""
    if dtype is None:
        return torch.get_default_dtype()
    if isinstance(dtype, str):
        found = getattr(torch, dtype, None)
        if not isinstance(found, torch.dtype):
            raise ValueError(f"unknown dtype name {dtype!r}; use e.g. 'float32' or 'int64'")
        return found
    return dtype


def _fits(x: Any, shape: tuple[int, ...], integral: bool, span: range | None = None) -> bool:
    """Whether nested lists ``x`` hold Python numbers in exactly ``shape`` (integers in
    ``span``, when given: the range of an integer dtype)."""
    if not shape:
        kind = type(x)
        if kind is int:
            return span is None or x in span
        return kind is bool or (kind is float and not integral)
    if type(x) not in (list, tuple) or len(x) != shape[0]:
        return False
    if len(shape) == 1:
        kinds = (int, bool) if integral else _NUMBERS
        if not all(type(v) in kinds for v in x):
            return False
        return span is None or all(v in span for v in x if type(v) is int)
    return all(_fits(item, shape[1:], integral, span) for item in x)


def _fits_span(x: torch.Tensor, span: range) -> bool:
    """Whether a tensor's values are integers in ``span`` (a cast would keep them)."""
    with torch._C.DisableTorchFunction():
        if x.is_complex() or (x.is_floating_point() and not torch.equal(x, x.trunc())):
            return False
        return x.numel() == 0 or span.start <= x.min().item() and x.max().item() < span.stop


def _lossy_cast(x: torch.Tensor, dtype: torch.dtype, span: range | None) -> str | None:
    """What ``dtype`` takes, if casting ``x`` to it would change a value (an imaginary part
    dropped, a fraction cut); ``None`` if the cast keeps every value, as Python numbers are
    checked: floats take any real number, integer and bool types integers."""
    if dtype.is_complex:
        return None
    if x.is_complex():
        return "real numbers"
    if dtype.is_floating_point:
        return None
    if span is not None:
        return None if _fits_span(x, span) else f"integers in [{span.start}, {span.stop - 1}]"
    whole = _fits_span(x, range(-(2**63), 2**63))  # bool: any integer, as torch.tensor(2) does
    return None if whole else "integers"


def _span(dtype: torch.dtype) -> range | None:
    """The integers a dtype holds (``None``: any, as floats and bool take every int)."""
    if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
        return None
    info = torch.iinfo(dtype)
    return range(info.min, info.max + 1)


class _TensorInput(Block):
    """Converts a Python number, nested list, NumPy array or tensor to a tensor of one type."""

    def __init__(self, shape: Sequence[int], dtype: torch.dtype | str | None) -> None:
        self.type = TensorType(tuple(shape), as_dtype(dtype))
        self.in_type = PyObjectType()

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        if not isinstance(in_type, PyObjectType):
            raise BlockTypeError(
                self, path, "a Python object (number, list, array, tensor)", in_type
            )
        t = self.type
        scalar = ctx.spec(OpSpec(f"input{list(t.shape)}", path, (), (t,), source="scalar"))
        stack = ctx.spec(OpSpec(f"input{list(t.shape)}", path, (), (t,), source="tensor"))
        integral = not (t.dtype.is_floating_point or t.dtype.is_complex)
        shape, block, span = t.shape, self, _span(t.dtype)

        def walk(tape: Tape, x: Any) -> int:
            if _fits(x, shape, integral, span):
                if 0 in shape:  # no values: torch.tensor([]) would drop the dims after the 0
                    return tape.source(stack, torch.zeros(shape, dtype=t.dtype, device=tape.device))
                return tape.source(scalar, x)
            kind = type(x)
            if kind is Lazy:
                return _lazy_vid(tape, block, path, x, t)
            if isinstance(x, torch.Tensor):
                if tuple(x.shape) != shape:
                    raise tape.fail(block, path, f"got a tensor of shape {tuple(x.shape)}")
                if x.dtype != t.dtype:
                    lossy = _lossy_cast(x, t.dtype, span)  # refused, as a number would be
                    if lossy is not None:
                        raise tape.fail(block, path, f"expected {lossy}, got a {x.dtype} tensor")
                    x = x.to(t.dtype)
                if tape.lazy and x.device != tape.device:
                    x = x.to(tape.device)
                return tape.source(stack, x)
            if isinstance(x, (np.ndarray, np.generic)) and _fits(x.tolist(), shape, integral, span):
                return walk(tape, x.tolist())
            want = "integers" if integral else "numbers"
            if span is not None and _fits(x, shape, integral):  # out of the dtype's range
                want += (
                    f" in [{span.start}, {span.stop - 1}] ({str(t.dtype).removeprefix('torch.')})"
                )
            raise tape.fail(block, path, f"expected {want} of shape {shape}, got {short(x, 60)}")

        if shape:
            return Walker(t, walk)
        kinds = frozenset({int, bool} if integral else {int, bool, float})

        def emit(em: Emitter, x: Symbol) -> Symbol:  # a Python number inline, the rest by walk
            value, out = em.expr(x), em.local()
            fits = f"type({value}) in {em.const(kinds)}"
            if span is not None:  # an int out of the dtype's range: walk's error
                fits = f"{fits} and {span.start} <= {value} <= {span.stop - 1}"
            with em.indented(f"if {fits}:"):
                em.line(f"{out} = tape.source({em.const(scalar, 's')}, {value})")
            with em.indented("else:"):
                em.line(f"{out} = {em.const(walk, 'w')}(tape, {value})")
            return out

        return Walker(t, walk, emit)


def _lazy_vid(tape: Tape, block: Block, path: str, x: Lazy, t: TensorType) -> int:
    """The value id of a lazy value from the running ``batch_map``, checked against ``t``."""
    rec = x._rec
    if rec.graph is not tape.graph:
        raise tape.fail(block, path, "got a lazy value of another batch_map call")
    meta = x._meta
    if meta.shape != t.shape or meta.dtype != t.dtype:
        raise tape.fail(block, path, f"got a lazy {meta}, expected {t!r}")
    return x._vid


class Tensor(_TensorInput):
    """A Python value (number, nested list, array or tensor) as a tensor of one shape and dtype.

    Arguments:
        shape: the per-instance shape.
        dtype: a ``torch.dtype`` or its name; the default dtype when left out.

    Example:
        >>> Tensor([2, 2], "int64").eval([[1, 2], [3, 4]])
        tensor([[1, 2],
                [3, 4]])
    """

    def __init__(self, shape: Sequence[int], dtype: torch.dtype | str | None = None) -> None:
        super().__init__(shape, dtype)

    def __repr__(self) -> str:
        return f"Tensor({list(self.type.shape)}, {self.type.dtype})"


class Scalar(_TensorInput):
    """A Python number as a 0-d tensor.

    Example:
        >>> Scalar("int64").eval(7)
        tensor(7)
    """

    def __init__(self, dtype: torch.dtype | str | None = None) -> None:
        super().__init__((), dtype)

    def __repr__(self) -> str:
        return f"Scalar({self.type.dtype})"


class Vector(_TensorInput):
    """A list of ``size`` numbers as a 1-d tensor.

    Example:
        >>> Vector(3).eval([1.0, 2.0, 3.0])
        tensor([1., 2., 3.])
    """

    def __init__(self, size: int, dtype: torch.dtype | str | None = None) -> None:
        super().__init__((size,), dtype)

    def __repr__(self) -> str:
        return f"Vector({self.type.shape[0]}, {self.type.dtype})"


class OneHot(Block):
    """A Python int in ``[start, stop)`` as a one-hot vector of length ``stop - start``.

    Each distinct value is one constant row per batch, shared by every instance.

    Arguments:
        start: the first value (or, with ``stop`` left out, the number of values from 0).
        stop: one past the last value.
        dtype: the vector's dtype (default dtype when left out).

    Example:
        >>> OneHot(2, 5).eval(3)
        tensor([0., 1., 0.])
    """

    def __init__(
        self, start: int, stop: int | None = None, dtype: torch.dtype | str | None = None
    ) -> None:
        if stop is None:
            start, stop = 0, start
        if stop <= start:
            raise ValueError(f"OneHot needs start < stop, got {start}, {stop}")
        self.start, self.stop, self.dtype = start, stop, as_dtype(dtype)
        self.in_type = PyObjectType()

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        if not isinstance(in_type, PyObjectType):
            raise BlockTypeError(self, path, "a Python int", in_type)
        start, stop, block = self.start, self.stop, self
        t = TensorType((stop - start,), self.dtype)
        spec = ctx.spec(OpSpec(f"one_hot{stop - start}", path, (), (t,), source="scalar"))

        def walk(tape: Tape, x: Any) -> int:
            if type(x) is not int or not start <= x < stop:
                raise tape.fail(block, path, f"expected an int in [{start}, {stop}), got {x!r}")
            return tape.shared_source(spec, x, lambda: _one_hot_row(x - start, stop - start))

        return Walker(t, walk)

    def __repr__(self) -> str:
        return f"OneHot({self.start}, {self.stop}, {self.dtype})"


def _one_hot_row(index: int, size: int) -> list[int]:
    row = [0] * size
    if index >= 0:
        row[index] = 1
    return row


class OneHotFromList(Block):
    """One-hot over a list of values: ``elements[i]`` becomes unit vector ``i``.

    Arguments:
        elements: the values, each hashable and listed once.
        dtype: the vector's dtype.
        strict: whether an unknown value is an error; otherwise it gives a zero vector.

    Example:
        >>> OneHotFromList(["a", "b", "c"], strict=False).eval("z")
        tensor([0., 0., 0.])
    """

    def __init__(
        self, elements: Sequence[Any], dtype: torch.dtype | str | None = None, strict: bool = True
    ) -> None:
        self.elements = list(elements)
        self.index = {e: i for i, e in enumerate(self.elements)}
        if len(self.index) != len(self.elements):
            raise ValueError("OneHotFromList elements must be distinct")
        self.dtype, self.strict = as_dtype(dtype), strict
        self.in_type = PyObjectType()

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        if not isinstance(in_type, PyObjectType):
            raise BlockTypeError(self, path, "a Python object", in_type)
        index, strict, size, block = self.index, self.strict, len(self.elements), self
        t = TensorType((size,), self.dtype)
        spec = ctx.spec(OpSpec(f"one_hot{size}", path, (), (t,), source="scalar"))

        def walk(tape: Tape, x: Any) -> int:
            try:
                i = index.get(x, -1)
            except TypeError:  # unhashable: never an element, nor a value to ignore
                raise tape.fail(block, path, f"expected an element, got {short(x, 60)}") from None
            if i < 0 and strict:
                raise tape.fail(block, path, f"{x!r} is not one of the elements")
            return tape.shared_source(spec, i, lambda: _one_hot_row(i, size))

        return Walker(t, walk)

    def __repr__(self) -> str:
        return f"OneHotFromList({self.elements!r}, {self.dtype}, strict={self.strict})"


class Concat(Block):
    """A tuple of tensors -> one tensor, joined along ``dim`` (0-d tensors count as length 1).

    Arguments:
        dim: the per-instance dimension to join along.
        flatten: accept nested tuples, joining all their tensors in order.

    Example:
        >>> from batchfold.blocks import Record
        >>> (Record((Vector(2), Scalar())) >> Concat()).eval(([1.0, 2.0], 3.0))
        tensor([1., 2., 3.])
    """

    def __init__(self, dim: int = 0, flatten: bool = False) -> None:
        self.dim, self.flatten = dim, flatten

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        flat_ok = isinstance(in_type, TupleType) and all(
            isinstance(i, TensorType) for i in in_type.items
        )
        if not (in_type != TupleType() and is_tensors(in_type) and (flat_ok or self.flatten)):
            nested = " (nested only with flatten=True)" if not self.flatten else ""
            raise BlockTypeError(self, path, f"a tuple of tensors{nested}", in_type)
        ins = flat_tensor_types(in_type)
        shapes = [t.shape or (1,) for t in ins]
        rank = len(shapes[0])
        dim = self.dim % rank if -rank <= self.dim < rank else None
        same = all(
            len(s) == rank
            and all(a == b for k, (a, b) in enumerate(zip(s, shapes[0], strict=True)) if k != dim)
            for s in shapes
        )
        if dim is None or not same or len({t.dtype for t in ins}) > 1:
            raise BlockTypeError(
                self,
                path,
                f"tensors of one dtype whose shapes differ only in dim {self.dim}",
                in_type,
            )
        size = sum(s[dim] for s in shapes)
        out = TensorType(
            tuple(size if k == dim else d for k, d in enumerate(shapes[0])), ins[0].dtype
        )

        def batched(sig: Signature, inputs: list[torch.Tensor], n: int) -> torch.Tensor:
            parts = [x.reshape(n, *shape) for x, shape in zip(inputs, shapes, strict=True)]
            return torch.cat(parts, dim=dim + 1)

        rule = OpRule("concat", batched, cheap=True)
        spec = ctx.spec(OpSpec("concat", path, tuple(ins), (out,), rule, torch.cat))
        return call_walker(spec, in_type, out)

    def __repr__(self) -> str:
        return f"Concat({self.dim}, flatten={self.flatten})"


__all__ = [
    "Concat",
    "FromTensor",
    "OneHot",
    "OneHotFromList",
    "Scalar",
    "Tensor",
    "Vector",
    "Zeros",
    "as_dtype",
]
