"""Walks as generated Python: a compiled model's walkers inlined into a few functions.

A :class:`~batchfold.blocks.walker.Walker` may carry ``emit(em, x)``, which writes the
statements that walk the input ``x`` into an :class:`Emitter` and returns the output as a
*symbol*: the source of a cheap expression without side effects (a local name, ``v3[0]``,
``x``) or a tuple of symbols, for a tuple known when the code is written. A walker without
``emit`` is called as a function. :func:`generate` writes one function for the model's root
and one per ``ForwardDeclaration``, so recording a tree node costs a few Python calls instead
of one or more per block; the blocks' own ``walk`` closures stay the reference semantics,
and error paths call them or raise the same errors.
"""

# Why composite blocks are written twice (a ``walk`` closure and an ``emit``): recording the
# Tree-LSTM blocks model (``tree_lstm_blocks``, 300/150 sizes) on one batch of 256 random
# trees (``benchmarks/baselines.make_batches(2, 256)``), ``CompiledModel.schedule``'s
# ``record_s``, generated walks against closures (``compiler.generate`` patched to return
# ``walker.walk``, as the ``walks`` test fixture does), 9 interleaved repeats, torch threads 1,
# on 2 shared cores that other jobs loaded (load average 1.7, then 5.9):
#   generated: median 46.5 ms (min 38.3)  |  closures: median 119.2 ms (min 91.7)
#   generated: median 73.3 ms (min 69.2)  |  closures: median 180.7 ms (min 128.9)
# about 2.5x less recording time, in line with the earlier 73 ms -> 31 ms; so both stay.
# The closures remain the reference semantics (tests run both through the ``walks`` fixture).

from __future__ import annotations

import itertools
import linecache
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeAlias

from .types import TensorType, TupleType, Type

if TYPE_CHECKING:
    from .walker import Walk, Walker

Symbol: TypeAlias = "str | tuple[Symbol, ...] | None"
Emit = Callable[["Emitter", Symbol], Symbol]

MAX_LINES = 4000  # past this a function stops inlining and calls its walkers instead
_serial = itertools.count()


class Emitter:
    """The source of one generated walk function and the objects it refers to."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.names: dict[str, Any] = {}  # global name in the generated code -> object
        self._by_id: dict[int, str] = {}
        self._locals = itertools.count()
        self.depth = 1

    def const(self, obj: Any, prefix: str = "k") -> str:
        """A global name for ``obj`` in the generated code (``prefix`` is never ``v``)."""
        name = self._by_id.get(id(obj))
        if name is None:
            name = self._by_id[id(obj)] = f"{prefix}{len(self.names)}"
            self.names[name] = obj  # kept alive, so its id is not reused meanwhile
        return name

    def line(self, text: str) -> None:
        """Append one statement at the current indentation."""
        self.lines.append("    " * self.depth + text)

    @contextmanager
    def indented(self, header: str) -> Iterator[None]:
        """Write ``header`` (``if ...:``, ``try:``) and indent what is written inside."""
        self.line(header)
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    def assign(self, expression: str) -> str:
        """Evaluate ``expression`` once into a new local; returns its name."""
        name = f"v{next(self._locals)}"
        self.line(f"{name} = {expression}")
        return name

    def local(self) -> str:
        """A new local name, for a value that several branches assign."""
        return f"v{next(self._locals)}"

    def expr(self, symbol: Symbol) -> str:
        """The source of a symbol's value."""
        if symbol is None:
            return "None"
        if isinstance(symbol, str):
            return symbol
        items = [self.expr(item) for item in symbol]
        return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"

    def item(self, symbol: Symbol, index: int) -> Symbol:
        """Item ``index`` of a tuple value: picked now when the tuple is known, else read."""
        if isinstance(symbol, tuple):
            return symbol[index]
        return f"{self.expr(symbol)}[{index}]"

    def value(self, walker: Walker, x: Symbol) -> Symbol:
        """The output of ``walker`` on ``x``: its code inlined, or a call of its walk."""
        if walker.emit is None or len(self.lines) > MAX_LINES:
            return self.assign(f"{self.const(walker.walk, 'w')}(tape, {self.expr(x)})")
        return walker.emit(self, x)

    def read(
        self, x: Symbol, key: Any, fail: Callable[[Any, Any, BaseException], Exception]
    ) -> str:
        """``x[key]`` into a new local; a failed read raises ``fail(tape, key, error)``."""
        name = self.local()
        with self.indented("try:"):
            self.line(f"{name} = {self.expr(x)}[{self.const(key)}]")
        with self.indented("except (KeyError, IndexError, TypeError) as error:"):
            self.line(f"raise {self.const(fail, 'f')}(tape, {self.const(key)}, error) from None")
        return name


def flat_ids(em: Emitter, x: Symbol, t: Type) -> list[str]:
    """The value ids of a tensor (tuple) value of type ``t``, depth first."""
    if isinstance(t, TensorType):
        return [em.expr(x)]
    assert isinstance(t, TupleType)
    return [v for i, item in enumerate(t.items) for v in flat_ids(em, em.item(x, i), item)]


def structured(t: Type, ids: Iterator[str]) -> Symbol:
    """The symbol of a value of type ``t`` whose value ids are ``ids``, in order."""
    if isinstance(t, TensorType):
        return next(ids)
    assert isinstance(t, TupleType)
    return tuple(structured(item, ids) for item in t.items)


def generate(walker: Walker, name: str) -> Walk:
    """One Python function that does what ``walker.walk`` does, with its walkers inlined."""
    if walker.emit is None:
        return walker.walk
    em = Emitter()
    out = walker.emit(em, "x")
    em.line(f"return {em.expr(out)}")
    source = "def walk(tape, x):\n" + "\n".join(em.lines) + "\n"
    filename = f"<batchfold walk {next(_serial)}: {name}>"
    namespace = dict(em.names)
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    return namespace["walk"]


__all__ = ["Emit", "Emitter", "Symbol", "flat_ids", "generate", "structured"]
