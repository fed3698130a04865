"""Recursion: ``ForwardDeclaration``, and declarations with no base case, refused before any walk.

A declaration's references walk the declared block when they run, so a block may contain
itself.

:class:`RecursionCheck` is a :class:`~batchfold.blocks.walker.Specializer` that also notes which
walks (a block on an input type) each walk calls. A walk *can finish* when, on some path,
every walk it calls can: a ``Pipe``, ``Record``, ``AllOf`` or ``Composition`` calls all its
children, a ``OneOf`` one of its cases, an ``Optional`` one of its two cases, a ``Fold`` or
an ``RNN`` only its start state, and a ``Map`` over a finite sequence or a ``Reduce`` may call
nothing (the sequence may be empty). The walks that can finish are the least fixed point of
these rules, so a declaration whose body is not among them calls itself again on every path,
whatever the input. Blocks the rules do not know are taken to finish: a model is refused only
when every path provably recurses.
"""

from __future__ import annotations

import sys
from typing import Any

from .base import Block
from .combinators import AllOf, Pipe, Record
from .conditionals import OneOf, Optional
from .convert import convert_to_block
from .sequences import RNN, Fold, Map
from .types import (
    BlockInputError,
    BlockTypeError,
    BroadcastSequenceType,
    Type,
    VoidType,
    canonical,
    short,
)
from .walker import Specializer, Walker
from .wiring import Composition


class ForwardDeclaration:
    """A block declared before it is defined, for recursion: ``decl()`` gives a reference.

    Arguments:
        input_type: the input type of the declared block.
        output_type: its output type.
        name: the name used in paths and errors.

    Example:
        >>> import torch
        >>> from batchfold.blocks import Map, OneOf, PyObjectType, Scalar, Sum, TensorType
        >>> expr = ForwardDeclaration(PyObjectType(), TensorType((), torch.float32))
        >>> nested = OneOf(lambda x: isinstance(x, list), {False: Scalar("float32"),
        ...                                                True: Map(expr()) >> Sum()})
        >>> expr.resolve_to(nested)
        >>> expr().eval([1.0, [2.0, [3.0]]])
        tensor(6.)
    """

    def __init__(self, input_type: Type, output_type: Type, name: str = "forward") -> None:
        self.input_type, self.output_type = canonical(input_type), canonical(output_type)
        self.name = name
        self.target: Block | None = None

    def __call__(self) -> ForwardRef:
        return ForwardRef(self)

    def resolve_to(self, block: Any) -> None:
        """Define the declared block (once).

        Its types must match the declaration, and some path through it must not call the
        declaration again (a base case), else it raises ``BlockTypeError``.
        """
        if self.target is not None:
            raise ValueError(f"{self!r} is already resolved to {short(self.target)}")
        self.target = convert_to_block(block)
        try:
            check = RecursionCheck(check=True)
            check.forward(self)
            check.refuse_endless()  # declarations not yet resolved count as base cases
        except Exception:
            self.target = None
            raise

    def __repr__(self) -> str:
        return f"ForwardDeclaration({self.input_type!r}, {self.output_type!r}, name={self.name!r})"


class ForwardRef(Block):
    """A use of a :class:`ForwardDeclaration` (made by calling it)."""

    def __init__(self, declaration: ForwardDeclaration) -> None:
        self.declaration = declaration
        self.in_type = declaration.input_type

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        decl = self.declaration
        if canonical(in_type) != decl.input_type:
            raise BlockTypeError(self, path, repr(decl.input_type), in_type)
        return ctx.forward(decl)

    def __repr__(self) -> str:
        return f"{self.declaration.name}()"


Key = tuple[int, Type]  # a walk: (id of the block, input type), as the Specializer memoises it

_ALL_CHILDREN = (Pipe, Record, AllOf, Composition, ForwardRef)


class RecursionCheck(Specializer):
    """A :class:`Specializer` that can refuse declarations which recurse on every path.

    Specialise as usual, then call :meth:`refuse_endless`.
    """

    def __init__(self, check: bool = False) -> None:
        super().__init__(check)
        self.walks: dict[Key, tuple[Block, Type, str]] = {}  # block, input type, first path
        self.calls: dict[Key, list[Key]] = {}  # the walks each walk calls, in call order
        self.finished: list[Key] = []  # in the order their specialisation ended (callees first)
        self.declared: list[ForwardDeclaration] = []  # resolved declarations, first reached first
        self._stack: list[Key] = []

    def child(self, block: Block, in_type: Type, path: str) -> Walker:
        key = (id(block), in_type)
        if self._stack:
            self.calls[self._stack[-1]].append(key)
        if key in self.walks:
            return super().child(block, in_type, path)
        self.walks[key], self.calls[key] = (block, in_type, path), []
        self._stack.append(key)
        try:
            return super().child(block, in_type, path)
        finally:
            self._stack.pop()
            self.finished.append(key)

    def forward(self, decl: Any) -> Walker:
        if decl.target is not None:
            if (id(decl), decl.input_type) not in self.memo:
                self.declared.append(decl)  # the first use specialises the target via child
            elif self._stack:
                self.calls[self._stack[-1]].append((id(decl.target), decl.input_type))
        return super().forward(decl)

    def refuse_endless(self) -> None:
        """Raise ``BlockTypeError`` if a declaration reached recurses on every path."""
        done: set[Key] = set()
        changed = True
        while changed:  # passes in callee-first order: one per nested cycle, plus one
            changed = False
            for key in self.finished:
                if key not in done and self._blocker(key, done) is None:
                    done.add(key)
                    changed = True
        for decl in self.declared:
            if (id(decl.target), decl.input_type) not in done:
                raise self._error(decl, done)

    def _blocker(self, key: Key, done: set[Key]) -> Key | None:
        """A walk that ``key`` calls on every path and that cannot finish (None: it can)."""
        block, in_type, _ = self.walks[key]
        for group in _must_call(block, in_type, self.calls[key]):
            if group and not any(callee in done for callee in group):
                return group[0]
        return None

    def _error(self, decl: ForwardDeclaration, done: set[Key]) -> BlockTypeError:
        """The error naming the loop that ``decl`` falls into, from a declaration to its use."""
        chain: list[Key] = []
        key: Key | None = (id(decl.target), decl.input_type)
        while key is not None and key not in chain:
            chain.append(key)
            key = self._blocker(key, done)
        loop = chain[chain.index(key) :] if key is not None else chain
        uses = {
            i: block.declaration
            for i, k in enumerate(loop)
            if isinstance(block := self.walks[k][0], ForwardRef)
        }
        if uses:  # start the loop at the body of the first declaration it uses
            first = min(uses, key=lambda i: self.declared.index(uses[i]))
            loop, decl = loop[first + 1 :] + loop[: first + 1], uses[first]
        steps = " -> ".join(_describe(*self.walks[k]) for k in loop)
        return BlockTypeError(
            decl,
            decl.name,
            f"a base case: every path through {decl.name} calls {decl.name}() again ({steps}), "
            "so no input can finish",
            None,
            hint=f"Add a case that does not recurse, e.g. a OneOf case without {decl.name}(), "
            "or recurse through Map or Optional, which may call it on nothing.",
            verb="needs",
        )


def _must_call(block: Block, in_type: Type, calls: list[Key]) -> list[list[Key]]:
    """Groups of the walks ``block`` calls: on every path it calls one walk of each group."""
    kind = type(block)  # exact types: a subclass may walk its children differently
    if kind in _ALL_CHILDREN or (kind is Map and isinstance(in_type, BroadcastSequenceType)):
        return [[callee] for callee in calls]
    if type(block) is OneOf:  # the pre_block (specialised first), then one of the cases
        pre = 1 if block.pre_block is not None else 0
        return [[callee] for callee in calls[:pre]] + [calls[pre:]]
    if kind is Optional:
        return [calls]
    if kind in (Fold, RNN):  # the start state (on void) is walked even for an empty sequence
        return [[callee] for callee in calls if callee[1] == VoidType()]
    return []  # Map over a finite sequence, Reduce, and blocks these rules do not know


def _describe(block: Block, in_type: Type, path: str) -> str:
    name = repr(block) if isinstance(block, ForwardRef) else type(block).__name__
    return f"{name} at {path}"


def too_deep(error: RecursionError, index: int) -> BlockInputError | None:
    """A clear error for input ``index`` whose walk hit Python's recursion limit in a declaration.

    Counts the frames of each declaration's generated walk function; ``None`` when no walk
    recursed through one (the limit was hit elsewhere, e.g. in a user's function).
    """
    depths: dict[str, int] = {}
    tb = error.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename  # "<batchfold walk 3: name>" (codegen)
        if filename.startswith("<batchfold walk "):
            name = filename.partition(": ")[2][:-1]
            depths[name] = depths.get(name, 0) + 1
        tb = tb.tb_next
    if not depths or max(depths.values()) < 2:
        return None
    name = max(depths, key=lambda n: depths[n])
    return BlockInputError(
        f"input {index} is too deep to record: {name} was {depths[name]:,} calls deep when "
        f"Python's recursion limit ({sys.getrecursionlimit()}) was reached. Check that the "
        "input does not contain itself; for deeper inputs raise sys.setrecursionlimit."
    )


__all__ = ["ForwardDeclaration", "ForwardRef", "RecursionCheck", "too_deep"]
