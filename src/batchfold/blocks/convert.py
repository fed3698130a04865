"""Python values as blocks, and the blocks ``Block``'s own methods make: two small registries.

:mod:`.base` defines ``Block`` below every block built on it, so it cannot import them.
Instead the modules that define blocks register here what ``Block`` needs from them: a
converter per kind of Python value (:func:`register_converter`; a tuple becomes a ``Record``,
an ``nn.Module`` a ``Function``, ...) and the constructors behind ``a >> b``, ``reads`` and
``eval`` (:data:`constructors`). Importing any module of :mod:`batchfold.blocks` first runs
the package's ``__init__``, which imports every module, so the registries are full before
any block is made.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from .types import short

if TYPE_CHECKING:
    from .base import Block

Converter = Callable[[Any], "Block"]
C = TypeVar("C", bound=Converter)

_CONVERTERS: dict[type, Converter] = {}


def register_converter(*kinds: type) -> Callable[[C], C]:
    """Decorator: ``convert_to_block`` turns instances of ``kinds`` into blocks with it.

    The most specific registered class of a value (first in its MRO) picks the converter.
    """

    def register(convert: C) -> C:
        for kind in kinds:
            _CONVERTERS[kind] = convert
        return convert

    return register


def convert_to_block(obj: Any) -> Block:
    """A block for ``obj``: blocks stay; modules, tensors and containers convert.

    An ``nn.Module`` becomes a ``Function`` (with the module's ``block_in_type``, if it has
    one), a tensor a ``FromTensor``, and a dict, list or tuple of blocks a ``Record``.

    Example:
        >>> from batchfold.blocks import Identity
        >>> convert_to_block((Identity(), Identity()))
        Record((Identity(), Identity()))
    """
    for kind in type(obj).__mro__:
        convert = _CONVERTERS.get(kind)
        if convert is not None:
            return convert(obj)
    raise TypeError(
        f"cannot use {short(obj)} ({type(obj).__name__}) as a block; expected a Block, an "
        "nn.Module, a tensor, or a dict, list or tuple of blocks. Wrap a batched callable "
        "as Function(fn) and a Python function on inputs as InputTransform(fn)."
    )


class Constructors:
    """The blocks and models ``Block``'s methods make, set by the modules defining them."""

    pipe: Callable[[Any, Any], Block]
    """``Pipe(a, b)``, for ``a >> b`` (set by :mod:`.combinators`)."""
    reads: Callable[[Block, tuple[Any, ...]], Any]
    """``wiring.reads``, for ``block.reads(...)`` (set by :mod:`.wiring`)."""
    evaluator: Callable[[Block], Any]
    """A model that evaluates one input, for ``block.eval`` (set by :mod:`.compiler`)."""


constructors = Constructors()

__all__ = ["Constructors", "constructors", "convert_to_block", "register_converter"]
