"""Blocks that choose, per input, which child block runs: ``OneOf`` and ``Optional``.

``OneOf`` dispatches on a key computed from the input; ``Optional`` runs its ``some_case`` on a
value and its ``none_case`` on ``None``. Every case must give the same output type.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .base import Block
from .codegen import Emitter, Symbol
from .constants import Zeros, zeroable
from .convert import convert_to_block
from .types import BlockTypeError, Type, VoidType, short
from .walker import Specializer, Tape, Walker


class OneOf(Block):
    """Dispatch on a Python key: ``cases[key_fn(x)]`` gets the input (or ``pre_block(x)``).

    Every case takes the same input type and must give the same output type.

    Arguments:
        key_fn: computes the key from the (raw) input.
        cases: a dict from keys to blocks, or a list or tuple (keys 0, 1, ...).
        pre_block: applied to the input before the chosen case.

    Example:
        >>> import torch
        >>> from batchfold.blocks import Function, Scalar
        >>> sign = OneOf(lambda x: x >= 0, {True: Scalar(), False: Scalar() >> Function(torch.neg)})
        >>> sign.eval(-2.0)
        tensor(2.)
    """

    def __init__(
        self,
        key_fn: Callable[[Any], Any],
        cases: Mapping[Any, Any] | Sequence[Any],
        pre_block: Any = None,
    ) -> None:
        self.key_fn = key_fn
        items = list(cases.items()) if isinstance(cases, Mapping) else list(enumerate(cases))
        if not items:
            raise ValueError("OneOf needs at least one case")
        self.cases = {key: convert_to_block(block) for key, block in items}
        self.pre_block = convert_to_block(pre_block) if pre_block is not None else None
        if self.pre_block is not None:
            self.in_type = self.pre_block.in_type
        else:
            fixed = [c.in_type for c in self.cases.values() if c.in_type is not None]
            self.in_type = fixed[0] if fixed else None
        self._check()

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        pre, pre_walker, t = None, None, in_type
        if self.pre_block is not None:
            pre_walker = ctx.child(self.pre_block, in_type, f"{path}.pre_block")
            pre, t = pre_walker.walk, pre_walker.out_type
        cases: list[tuple[Any, Walker]] = []
        first: tuple[Any, Type, str] | None = None
        for key, case in self.cases.items():
            where = f"{path}.cases[{key!r}]"
            walker = ctx.child(case, t, where)
            if first is None:
                first = (key, walker.out_type, where)
            elif walker.out_type != first[1]:
                raise BlockTypeError(
                    case,
                    where,
                    f"to give {first[1]!r} like case {first[0]!r} at {first[2]}",
                    walker.out_type,
                    verb="is",
                    hint="Every case of a OneOf must give the same type.",
                )
            cases.append((key, walker))
        assert first is not None
        table = {key: walker.walk for key, walker in cases}
        key_fn, block = self.key_fn, self

        def fail(tape: Tape, key: Any) -> Exception:
            keys = ", ".join(map(repr, table))
            return tape.fail(block, path, f"key {key!r} has no case (cases: {keys})")

        def walk(tape: Tape, x: Any) -> Any:
            key = key_fn(x)
            case = _case_of(table, key)
            if case is None:
                raise fail(tape, key)
            return case(tape, x if pre is None else pre(tape, x))

        numbers = {key: i for i, (key, _) in enumerate(cases)}  # the same lookup as walk's

        def emit(em: Emitter, x: Symbol) -> Symbol:
            key = em.assign(f"{em.const(key_fn, 'f')}({em.expr(x)})")
            lookup = f"{em.const(_case_of, 'c')}({em.const(numbers, 'k')}, {key})"
            case, out = em.assign(lookup), em.local()
            for i, (_, walker) in enumerate(cases):
                with em.indented(f"{'elif' if i else 'if'} {case} == {i}:"):
                    arg = x if pre_walker is None else em.value(pre_walker, x)
                    em.line(f"{out} = {em.expr(em.value(walker, arg))}")
            with em.indented("else:"):
                em.line(f"raise {em.const(fail, 'f')}(tape, {key})")
            return out

        return Walker(first[1], walk, emit)

    def __repr__(self) -> str:
        name = getattr(self.key_fn, "__qualname__", None) or short(self.key_fn, 30)
        pre = f", pre_block={self.pre_block!r}" if self.pre_block is not None else ""
        cases = ", ".join(f"{k!r}: {c!r}" for k, c in self.cases.items())
        return f"OneOf({name}, {{{cases}}}{pre})"


class Optional(Block):
    """``some_case(x)``, or ``none_case()`` (default: zeros of the same type) when ``x`` is None.

    Example:
        >>> from batchfold.blocks import Scalar
        >>> Optional(Scalar()).eval(None)
        tensor(0.)
    """

    def __init__(self, some_case: Any, none_case: Any = None) -> None:
        self.some_case = convert_to_block(some_case)
        self.none_case = convert_to_block(none_case) if none_case is not None else None
        self.in_type = self.some_case.in_type
        self._check()

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        some = ctx.child(self.some_case, in_type, f"{path}.some_case")
        if self.none_case is None and not zeroable(some.out_type):
            raise BlockTypeError(
                self,
                path,
                "a some_case that gives tensors (or tuples or sequences of them), whose "
                "zeros the none case gives",
                some.out_type,
                hint="Give a none_case that makes a value of that type.",
            )
        none_block = self.none_case if self.none_case is not None else Zeros(some.out_type)
        none = ctx.child(none_block, VoidType(), f"{path}.none_case")
        if none.out_type != some.out_type:
            raise BlockTypeError(
                none_block,
                f"{path}.none_case",
                f"to give {some.out_type!r} like some_case",
                none.out_type,
                verb="is",
            )
        some_walk, none_walk = some.walk, none.walk
        return Walker(
            some.out_type,
            lambda tape, x: none_walk(tape, None) if x is None else some_walk(tape, x),
        )

    def __repr__(self) -> str:
        none = f", {self.none_case!r}" if self.none_case is not None else ""
        return f"Optional({self.some_case!r}{none})"


__all__ = [
    "OneOf",
    "Optional",
]


def _case_of(table: Mapping[Any, Any], key: Any) -> Any:
    """``table.get(key)``, ``None`` for an unhashable key (a list): no case, said as such."""
    try:
        return table.get(key)
    except TypeError:
        return None
