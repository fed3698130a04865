"""The ragged length as a traced call sees it: comparisons become guards, other uses refuse.

A module call on ragged inputs (a sequence ``[T, d]``, a molecule's ``[atoms, d]``) is
traced once and replayed for every length, so its ops must not depend on the length. While
such a call is traced, ``x.shape`` (and ``size()``, ``len(x)``, ``numel()``) of a ragged
value (an input, or what a ragged rule made from one at the call's length) gives its
leading dim as a :class:`Length`: not an ``int``, so that Python asks it for every use
(``range(n)``, ``items[n]``, ``0.5 * n``, ``float(n)``). Comparing it with a number (``if
h.shape[0] < 1: raise``) records a *guard*, checked again on every later call, which is
recorded op by op when a guard's answer changes. Any other use (arithmetic, an index, a
hash, a shape handed to a torch function, printing) refuses the cache for the call, which is
then recorded op by op; the use itself gets the plain number, as eager code would.

A call may take ragged inputs of several lengths (a molecule's ``[atoms, d]`` atoms and
``[pairs, e]`` pairs): each distinct length is a *class*, numbered in the order the inputs
show them, and a value's *flag* says which it is: :data:`FIXED`, rows of a class
(:func:`rows_flag`), or :data:`SQUARE` (``[L, L]`` of class 0).
"""

from __future__ import annotations

import copy
import dataclasses
import operator
from typing import Any, Protocol

import torch

Guard = tuple[str, Any, bool, int]  # (comparison, the number compared with, answer, class)

FIXED, ROWS, SQUARE = 0, 1, 2


def rows_flag(cls: int) -> int:
    """The flag of rows of length class ``cls``."""
    return ROWS if cls == 0 else SQUARE + cls


def class_of(flag: int) -> int:
    """The length class of a ragged value's flag (not :data:`FIXED`)."""
    return 0 if flag <= SQUARE else flag - SQUARE


_COMPARE = {
    "__lt__": operator.lt,
    "__le__": operator.le,
    "__gt__": operator.gt,
    "__ge__": operator.ge,
    "__eq__": operator.eq,
    "__ne__": operator.ne,
}


class Traced(Protocol):
    """What a :class:`Length` reports to: the trace of a module call on ragged inputs."""

    guards: list[Guard]

    def refuse(self, reason: str) -> None:
        """Mark the call as not cacheable."""


USED = "uses the length of a ragged input in {how} (only comparisons with numbers are allowed)"
LENGTH_NOTE = (
    "batchfold: {name} (called at {site}) was traced on ragged inputs, where x.shape[0] and "
    "len(x) are stand-ins for the length; if eager code does not raise this, a stand-in "
    "reached a function that takes a plain int (NumPy, json, some torch arguments): write "
    "int(x.shape[0]) there, or mark the module batchfold.no_cache(module)"
)


class Length:
    """The length of a traced call's ragged leading dim, of one class (see the module
    docstring)."""

    __slots__ = ("value", "trace", "cls")

    def __init__(self, value: int, trace: Traced, cls: int = 0) -> None:
        self.value, self.trace, self.cls = value, trace, cls

    def used(self, how: str) -> int:
        """Refuse the cache for the traced call; the plain number."""
        self.trace.refuse(USED.format(how=how))
        return self.value

    def __bool__(self) -> bool:
        answer = self.value != 0
        self.trace.guards.append(("__ne__", 0, answer, self.cls))
        return answer

    @property
    def __class__(self) -> type:  # type: ignore[override]  # isinstance(n, int): no use
        return int

    def __getattr__(self, name: str) -> Any:  # n.real, n.bit_length(): uses
        if name.startswith("__") or name in Length.__slots__:
            raise AttributeError(name)
        return getattr(self.used(f".{name}"), name)


def _comparison(name: str) -> Any:
    compare = _COMPARE[name]

    def method(self: Length, other: Any) -> Any:
        kind = type(other)
        if kind is int or kind is float:
            answer = compare(self.value, other)
            self.trace.guards.append((name, other, answer, self.cls))
            return answer
        if kind is Length and other.cls == self.cls:  # one class: the same answer for any length
            return compare(self.value, other.value)
        return compare(self.used(f"a comparison with {kind.__name__}"), other)

    return method


def _other(name: str) -> Any:
    plain = getattr(int, name)
    how = name.strip("_")

    def method(self: Length, *args: Any) -> Any:
        args = tuple(a.used(how) if type(a) is Length else a for a in args)
        value = self.used(how)
        result = plain(value, *args)
        if result is NotImplemented and len(args) == 1:  # int's own declines 0.5: n * 0.5
            reflected = getattr(args[0], _REFLECTED.get(name, name), None)
            result = reflected(value) if reflected is not None else NotImplemented
        return result

    return method


# n.__mul__(0.5) is answered by (0.5).__rmul__(n), n.__rmul__(0.5) by (0.5).__mul__(n)
_REFLECTED = {
    f"__{op}__": f"__r{op}__"
    for op in [
        "add",
        "sub",
        "mul",
        "floordiv",
        "truediv",
        "mod",
        "divmod",
        "pow",
        "and",
        "or",
        "xor",
        "lshift",
        "rshift",
    ]
}
_REFLECTED |= {reflected: plain for plain, reflected in _REFLECTED.items()}


for _name in _COMPARE:
    setattr(Length, _name, _comparison(_name))
_USES = """__add__ __radd__ __sub__ __rsub__ __mul__ __rmul__ __floordiv__ __rfloordiv__
__truediv__ __rtruediv__ __mod__ __rmod__ __divmod__ __rdivmod__ __pow__ __rpow__ __neg__
__pos__ __abs__ __invert__ __and__ __rand__ __or__ __ror__ __xor__ __rxor__ __lshift__
__rlshift__ __rshift__ __rrshift__ __index__ __int__ __float__ __hash__
__round__ __trunc__ __floor__ __ceil__ __repr__ __str__ __format__"""
for _name in _USES.split():
    setattr(Length, _name, _other(_name))


class TracedShape(tuple):
    """A traced ragged value's shape: a tuple holding :class:`Length` (``torch.Size`` holds
    ints only), with ``torch.Size``'s ``numel``."""

    __slots__ = ()

    @property
    def __class__(self) -> type:  # type: ignore[override]  # isinstance(x.shape, torch.Size)
        return torch.Size

    def __repr__(self) -> str:  # torch.Size's; each length's a use
        return f"torch.Size([{', '.join(map(repr, self))}])"

    __str__ = __repr__

    def numel(self) -> int:
        """Number of elements: a use of the length."""
        total = 1
        for dim in self:
            total *= dim.used("numel()") if type(dim) is Length else dim
        return total


def traced_size(
    size: tuple[int, ...], lengths: tuple[int, ...], trace: Traced, flag: int
) -> TracedShape:
    """The shape of a ragged value in a traced call (``lengths``: each class's), its leading
    dim a :class:`Length` (both dims for an ``[L, L]`` input)."""
    if flag == SQUARE:
        return TracedShape((Length(lengths[0], trace), Length(lengths[0], trace)))
    cls = class_of(flag)
    return TracedShape((Length(lengths[cls], trace, cls), *size[1:]))


def guards_hold(guards: list[Guard], lengths: tuple[int, ...]) -> bool:
    """Whether every guard of a trace gives the same answer for a call of ``lengths``."""
    return all(_COMPARE[name](lengths[cls], other) == answer for name, other, answer, cls in guards)


def plain_lengths(tree: Any) -> Any:
    """``tree`` (an op's arguments) with every :class:`Length` in it used: a plain number."""
    kind = type(tree)
    if kind is Length:
        return tree.used("an op's argument")
    if kind is tuple or kind is list or kind is TracedShape:
        if not any(type(item) is Length or type(item) in _NESTED for item in tree):
            return tree
        return (tuple if kind is TracedShape else kind)(plain_lengths(item) for item in tree)
    if kind is dict:
        return {name: plain_lengths(item) for name, item in tree.items()}
    return tree


_NESTED = (tuple, list, dict, TracedShape)


_IN_RESULTS = (Length, TracedShape, tuple, list, dict)


def plain_result(tree: Any) -> Any:
    """A traced call's result as eager code gets it back: a :class:`Length` its number (a use,
    so the call is not cached) and a :class:`TracedShape` a ``torch.Size``, also inside
    tuples (named ones too), lists, dicts (keys too) and dataclasses."""
    kind = type(tree)
    if kind is Length:
        return tree.used("the call's result")
    if kind is TracedShape:
        return torch.Size(plain_result(item) for item in tree)
    if isinstance(tree, (tuple, list)) and any(_holds_length(item) for item in tree):
        items = [plain_result(item) for item in tree]
        return kind(*items) if hasattr(tree, "_fields") else kind(items)
    if isinstance(tree, dict) and any(_holds_length(x) for x in (*tree, *tree.values())):
        new = copy.copy(tree)  # a dict subclass (defaultdict...) keeps its kind and settings
        new.clear()
        new.update((plain_result(k), plain_result(v)) for k, v in tree.items())
        return new
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        fields = {f.name: getattr(tree, f.name) for f in dataclasses.fields(tree) if f.init}
        if any(_holds_length(v) for v in fields.values()):
            return dataclasses.replace(tree, **{k: plain_result(v) for k, v in fields.items()})
    return tree


def _holds_length(item: Any) -> bool:
    return type(item) in (Length, TracedShape) or (
        isinstance(item, (tuple, list, dict)) or dataclasses.is_dataclass(item)
    )
