"""The ragged length as a traced call sees it: comparisons become guards, other uses refuse.

A module call on ragged inputs (a sequence ``[T, d]``, a molecule's ``[atoms, d]``) is
traced once and replayed for every length, so its ops must not depend on the length. While
such a call is traced, ``x.shape`` (and ``size()``, ``len(x)``, ``numel()``) of a ragged
value (an input, or what a ragged rule made from one) gives its leading dim as a
:class:`Length`: an ``int`` that notes what the code does with it. Comparing it with a number (``if h.shape[0] < 1: raise``)
records a *guard*, checked again on every later call, which is recorded op by op when a
guard's answer changes. Any other use (arithmetic, an index, a hash, a shape handed to a
torch function, printing) refuses the cache for the call, which is then recorded op by op.
Uses Python does in C without asking the number (``[0] * n``) are not seen here; the cache
still needs two traces of different lengths that recorded the same ops before it replays.
"""

from __future__ import annotations

import operator
from typing import Any, Protocol

import torch

Guard = tuple[str, Any, bool]  # (comparison, the number compared with, the answer)

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
    length: int | None
    ragged: dict[int, int]

    def refuse(self, reason: str) -> None:
        """Mark the call as not cacheable."""


USED = "uses the length of a ragged input in {how} (only comparisons with numbers are allowed)"


class Length(int):
    """The length of a traced call's ragged leading dim (see the module docstring)."""

    _trace: Traced

    def __new__(cls, value: int, trace: Traced) -> Length:
        """A length of ``value`` reporting to ``trace``."""
        self = super().__new__(cls, value)
        self._trace = trace
        return self

    def used(self, how: str) -> int:
        """Refuse the cache for the traced call; the plain number."""
        self._trace.refuse(USED.format(how=how))
        return int.__int__(self)

    def __bool__(self) -> bool:
        answer = int.__int__(self) != 0
        self._trace.guards.append(("__ne__", 0, answer))
        return answer


def _comparison(name: str) -> Any:
    compare = _COMPARE[name]

    def method(self: Length, other: Any) -> Any:
        kind = type(other)
        value = int.__int__(self)
        if kind is int or kind is float:
            answer = compare(value, other)
            self._trace.guards.append((name, other, answer))
            return answer
        if kind is Length:  # every ragged value of a call has its length: the same answer
            return compare(value, int.__int__(other))
        self.used(f"a comparison with {kind.__name__}")
        return compare(value, other)

    return method


def _other(name: str) -> Any:
    plain = getattr(int, name)

    def method(self: Length, *args: Any) -> Any:
        self.used(name.strip("_") if name.startswith("__") else name)
        return plain(int.__int__(self), *args)

    return method


for _name in _COMPARE:
    setattr(Length, _name, _comparison(_name))
_USES = """__add__ __radd__ __sub__ __rsub__ __mul__ __rmul__ __floordiv__ __rfloordiv__
__truediv__ __rtruediv__ __mod__ __rmod__ __divmod__ __rdivmod__ __pow__ __rpow__ __neg__
__pos__ __abs__ __invert__ __and__ __rand__ __or__ __ror__ __xor__ __rxor__ __lshift__
__rlshift__ __rshift__ __rrshift__ __index__ __int__ __float__ __hash__ __round__ __trunc__
__floor__ __ceil__ __repr__ __str__ __format__ __reduce__ __reduce_ex__ bit_length to_bytes
as_integer_ratio conjugate"""
for _name in _USES.split():
    setattr(Length, _name, _other(_name))


def traced_size(size: torch.Size, length: Any, trace: Traced, flag: int) -> torch.Size:
    """The size of a ragged value in a traced call, its leading dim a :class:`Length` (both
    dims for an ``[L, L]`` input: ``flag`` 2)."""
    if flag == 2:
        return torch.Size((Length(length, trace), Length(length, trace)))
    return torch.Size((Length(length, trace), *size[1:]))


def guards_hold(guards: list[Guard], length: int) -> bool:
    """Whether every guard of a trace gives the same answer for ``length``."""
    return all(_COMPARE[name](length, other) == answer for name, other, answer in guards)
