"""Block types: what a block takes and gives, checked when blocks are composed.

A tensor type is one instance's shape and dtype (no batch dimension). Tuples, sequences of
any length, broadcast (endless) sequences, Python objects and void complete the set, as in
TensorFlow Fold. A tuple or a sequence made only of Python objects is itself a Python object
(:func:`canonical`), so ``Map`` over a Python list of numbers has input type
``PyObjectType()``. The errors raised when types do not fit, :class:`BlockTypeError` and
:class:`BlockInputError`, are defined in :mod:`batchfold.errors` and re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..errors import BlockInputError as BlockInputError
from ..errors import BlockTypeError as BlockTypeError
from ..errors import short as short

__all__ = [
    "BlockInputError",
    "BlockTypeError",
    "BroadcastSequenceType",
    "PyObjectType",
    "SequenceType",
    "TensorType",
    "TupleType",
    "Type",
    "VoidType",
    "canonical",
    "flat_tensor_types",
    "is_tensors",
]


class Type:
    """Base class of the block types; every type is an immutable, hashable value."""

    __slots__ = ()


@dataclass(frozen=True, repr=False)
class TensorType(Type):
    """A tensor of a fixed per-instance shape and dtype.

    Arguments:
        shape: the shape of one instance's value (no batch dimension).
        dtype: the dtype; the default dtype of PyTorch when left out.

    Example:
        >>> TensorType((3,), torch.int64)
        TensorType((3,), torch.int64)
    """

    shape: tuple[int, ...]
    dtype: torch.dtype = field(default_factory=torch.get_default_dtype)

    def __post_init__(self) -> None:
        shape = tuple(self.shape)
        if not all(type(d) is int and d >= 0 for d in shape):
            raise ValueError(f"a TensorType shape holds sizes >= 0, got {self.shape!r}")
        object.__setattr__(self, "shape", shape)
        if not isinstance(self.dtype, torch.dtype):
            raise ValueError(f"a TensorType dtype is a torch.dtype, got {self.dtype!r}")

    def __repr__(self) -> str:
        return f"TensorType({self.shape!r}, {self.dtype})"


@dataclass(frozen=True, init=False, repr=False)
class TupleType(Type):
    """A fixed-size tuple of values of the given types.

    Example:
        >>> TupleType(TensorType((2,), torch.float32), PyObjectType())
        TupleType(TensorType((2,), torch.float32), PyObjectType())
    """

    items: tuple[Type, ...]

    def __init__(self, *items: Type) -> None:
        for item in items:
            if not isinstance(item, Type):
                raise ValueError(f"TupleType items are types, got {item!r}")
        object.__setattr__(self, "items", tuple(items))

    def __repr__(self) -> str:
        return f"TupleType({', '.join(map(repr, self.items))})"


@dataclass(frozen=True, repr=False)
class SequenceType(Type):
    """A sequence (a Python list at run time) of any length, every element of one type."""

    elem: Type

    def __repr__(self) -> str:
        return f"SequenceType({self.elem!r})"


@dataclass(frozen=True, repr=False)
class BroadcastSequenceType(Type):
    """An endless sequence repeating one value (made by ``Broadcast``, consumed by ``Zip``)."""

    elem: Type

    def __repr__(self) -> str:
        return f"BroadcastSequenceType({self.elem!r})"


@dataclass(frozen=True, repr=False)
class PyObjectType(Type):
    """Any Python object (the model's input, and what ``InputTransform`` gives)."""

    def __repr__(self) -> str:
        return "PyObjectType()"


@dataclass(frozen=True, repr=False)
class VoidType(Type):
    """No value (the input of ``FromTensor`` and ``Zeros``; the output of ``Metric``)."""

    def __repr__(self) -> str:
        return "VoidType()"


def canonical(t: Type) -> Type:
    """``t`` with every tuple or sequence made only of Python objects collapsed to one.

    Example:
        >>> canonical(SequenceType(TupleType(PyObjectType(), PyObjectType())))
        PyObjectType()
    """
    if isinstance(t, TupleType):
        items = tuple(canonical(i) for i in t.items)
        if items and all(isinstance(i, PyObjectType) for i in items):
            return PyObjectType()
        return TupleType(*items)
    if isinstance(t, (SequenceType, BroadcastSequenceType)):
        elem = canonical(t.elem)
        return PyObjectType() if isinstance(elem, PyObjectType) else type(t)(elem)
    return t


def is_tensors(t: Type) -> bool:
    """Whether ``t`` is a tensor type or a (nested, non-empty) tuple of tensor types."""
    if isinstance(t, TensorType):
        return True
    return isinstance(t, TupleType) and bool(t.items) and all(is_tensors(i) for i in t.items)


def flat_tensor_types(t: Type) -> list[TensorType]:
    """The tensor types of a tensor or nested tuple type, depth first."""
    if isinstance(t, TensorType):
        return [t]
    assert isinstance(t, TupleType)
    return [leaf for item in t.items for leaf in flat_tensor_types(item)]
