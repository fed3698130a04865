"""``Block``, the base class of all blocks, and ``Identity``.

A :class:`Block` is an immutable description; :mod:`.walker` specialises it to an input type
and records it. The blocks that ``Block``'s own methods make (``a >> b`` is a ``Pipe``,
``eval`` compiles a model) are defined on top of this module and found through
:mod:`.convert`, so this module imports none of them.
"""

from __future__ import annotations

from typing import Any

from .convert import constructors, convert_to_block, register_converter
from .types import BlockTypeError, Type
from .walker import Specializer, Tape, Walker


class Block:
    """Base class of all blocks: a typed function from one Python input to one output.

    Blocks are immutable and may be used in several places and several models; a block used
    twice shares its weights and its nodes batch together. ``a >> b`` is ``Pipe(a, b)``.
    """

    in_type: Type | None = None
    """The input type the block needs, when it is fixed (``None`` for generic blocks)."""

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        raise NotImplementedError

    def _check(self) -> None:
        """Infer types now if the input type is known, so a mismatch fails at composition."""
        if self.in_type is not None:
            Specializer(check=True).child(self, self.in_type, type(self).__name__)

    def output_type(self, in_type: Type | None = None) -> Type:
        """The output type for ``in_type`` (default: the block's own input type).

        Example:
            >>> import torch
            >>> from batchfold.blocks import Scalar
            >>> Scalar(torch.int64).output_type()
            TensorType((), torch.int64)
        """
        given = in_type if in_type is not None else self.in_type
        if given is None:
            raise BlockTypeError(self, type(self).__name__, "an input type to be given", None)
        return Specializer(check=True).child(self, given, type(self).__name__).out_type

    def reads(self, *wires: Any) -> Any:
        """Wire this block inside a ``Composition``: its input is ``wires`` (one, or a tuple)."""
        return constructors.reads(self, wires)

    def eval(self, x: Any) -> Any:
        """Run the block on one input (see ``CompiledModel.evaluate``), compiling it once.

        Example:
            >>> from batchfold.blocks import Map, Scalar, Sum
            >>> (Map(Scalar()) >> Sum()).eval([1.0, 2.0, 3.5])
            tensor(6.5000)
        """
        model = getattr(self, "_compiled", None)
        if model is None:
            model = self._compiled = constructors.evaluator(self)
        return model.evaluate(x)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_compiled", None)  # a cache, rebuilt on the next eval
        return state

    def __rshift__(self, other: Any) -> Block:
        return constructors.pipe(self, other)

    def __rrshift__(self, other: Any) -> Block:
        return constructors.pipe(other, self)


class Identity(Block):
    """Returns its input unchanged (any type).

    Example:
        >>> Identity().eval(3)
        3
    """

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        return Walker(in_type, _identity, lambda em, x: x)

    def __repr__(self) -> str:
        return "Identity()"


def _identity(tape: Tape, x: Any) -> Any:
    return x


register_converter(Block)(lambda block: block)

__all__ = ["Block", "Identity", "convert_to_block"]
