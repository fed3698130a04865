"""Blocks that give constants from no input: ``FromTensor`` and ``Zeros``.

``FromTensor`` gives a fixed tensor or parameter, ``Zeros`` a zero value of a type (the
default start state, padding or ``None`` case of other blocks). Their tensors are constant
nodes, one per batch, read by every instance.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .base import Block
from .convert import register_converter
from .types import BlockTypeError, SequenceType, TensorType, TupleType, Type, VoidType, short
from .walker import OpSpec, Specializer, Tape, Walker, void_or


class FromTensor(Block):
    """A fixed tensor or parameter as a block output; its input is ignored (void).

    Gradients reach the tensor when it requires them. The compiled model registers it (as a
    parameter when it is an ``nn.Parameter``, else as a buffer), so ``.to(device)`` moves it.

    Example:
        >>> FromTensor(torch.ones(2)).eval(None)
        tensor([1., 1.])
    """

    def __init__(self, tensor: torch.Tensor | np.ndarray) -> None:
        if isinstance(tensor, np.ndarray):
            tensor = torch.from_numpy(tensor)
        self.tensor = tensor
        self.in_type = VoidType()

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        if not void_or(in_type):
            raise BlockTypeError(self, path, "no input (VoidType or a Python object)", in_type)
        tensor = self.tensor
        ctx.tensor(tensor)
        t = TensorType(tuple(tensor.shape), tensor.dtype)

        def current(model: Any, device: torch.device) -> torch.Tensor:
            return model.tensor_for(tensor) if model is not None else tensor

        spec = ctx.spec(OpSpec("tensor", path, (), (t,), source="constant", constant=current))
        return Walker(t, lambda tape, x: tape.constant(spec))

    def __repr__(self) -> str:
        return f"FromTensor({short(self.tensor, 50)})"


class Zeros(Block):
    """Zeros of a type, from no input: a zero tensor, a tuple of them, or an empty sequence.

    Example:
        >>> Zeros(TensorType((2,), torch.float32)).eval(None)
        tensor([0., 0.])
    """

    def __init__(self, out_type: Type) -> None:
        if not zeroable(out_type):
            raise ValueError(f"Zeros cannot make a value of {out_type!r}")
        self.out_type = out_type
        self.in_type = VoidType()

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        if not void_or(in_type):
            raise BlockTypeError(self, path, "no input (VoidType or a Python object)", in_type)
        return Walker(self.out_type, _zeros_walk(self.out_type, ctx, path))

    def __repr__(self) -> str:
        return f"Zeros({self.out_type!r})"


def zeroable(t: Type) -> bool:
    """Whether :class:`Zeros` can make a value of type ``t``."""
    if isinstance(t, TupleType):
        return all(zeroable(i) for i in t.items)
    return isinstance(t, (TensorType, SequenceType, VoidType))


def _zeros_walk(t: Type, ctx: Specializer, path: str) -> Callable[[Tape, Any], Any]:
    if isinstance(t, TensorType):
        shape, dtype = t.shape, t.dtype

        def zeros(model: Any, device: torch.device) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        spec = ctx.spec(OpSpec("zeros", path, (), (t,), source="constant", constant=zeros))
        return lambda tape, x: tape.constant(spec)
    if isinstance(t, TupleType):
        parts = [_zeros_walk(item, ctx, path) for item in t.items]
        return lambda tape, x: tuple([part(tape, None) for part in parts])
    if isinstance(t, SequenceType):
        return lambda tape, x: []
    return lambda tape, x: None


register_converter(torch.Tensor)(FromTensor)

__all__ = [
    "FromTensor",
    "Zeros",
]
