"""Per-instance integers given where PyTorch takes a Python int: a size, a length, a count.

Eagerly, ``torch.zeros(n)``, ``x.expand(n, 4)`` or ``x.narrow(0, 0, n)`` with a 0-d integer
tensor ``n`` read its value (``n.__index__()``) and make a tensor of that size. Recorded as
it is, such a call would take its shape from the placeholder values that shapes are inferred
from (a size of 0, say). :func:`read_sizes` reads those values first, a sync point as
``int(n)`` would be, and passes the numbers on. The read runs everything recorded so far at
once instead of pausing the instance: it happens inside a PyTorch call (the mode's callback
or the argument parser, see ``Lazy.__index__``), where another instance must not run the
same call meanwhile.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from ..opbase import named
from .tensor import Lazy

if TYPE_CHECKING:
    from .recorder import Recorder

__all__ = ["read_numbers", "read_sizes"]

_FACTORIES = ("zeros", "ones", "empty", "full", "rand", "randn", "randint", "arange", "eye")
_FACTORIES_TOO = ("linspace", "logspace", "randperm", "tril_indices", "triu_indices")
_SIZE_FIRST = frozenset(getattr(torch, name) for name in (*_FACTORIES, *_FACTORIES_TOO))
"""Functions whose first argument is a size too (not a tensor operand)."""
_SIZE_TAKERS = _SIZE_FIRST | frozenset(
    named(
        *("new_zeros", "new_ones", "new_empty", "new_full", "expand", "repeat", "tile"),
        *("view", "reshape", "narrow", "unflatten", "broadcast_to", "select"),
        "ctc_loss",  # one sequence's input and target lengths
    )
)
"""Functions that read the value of a 0-d integer tensor given as a size, a length, a
position or a count."""


def read_sizes(
    rec: Recorder, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """``func``, ``args`` and ``kwargs`` with each 0-d integer lazy value that ``func`` takes
    as a number replaced by that number (read at once); unchanged for other functions. A
    leaf made like a lazy tensor (``torch.zeros_like(h, requires_grad=True)``) becomes the
    factory of its shape, whose leaf backward fills, as eagerly."""
    if func not in _WATCHED:  # nearly every call: one lookup
        return func, args, kwargs
    if func in _LIKE and args and type(args[0]) is Lazy and kwargs.get("requires_grad"):
        like = args[0]
        made = {"dtype": like.dtype, "device": like.device, **kwargs}
        made.pop("memory_format", None)
        return _LIKE[func], (tuple(like.shape), *args[1:]), made
    if func not in _SIZE_TAKERS:
        return func, args, kwargs
    first = 0 if func in _SIZE_FIRST else 1  # a method's or a view's tensor stays lazy
    tensors = func in _TENSOR_SIZES
    args = (*args[:first], *(_number(rec, a, tensors) for a in args[first:]))
    kwargs = {k: _number(rec, v, tensors) for k, v in kwargs.items()} if kwargs else kwargs
    return func, args, kwargs


_LIKE = {getattr(torch, f"{k}_like"): getattr(torch, k) for k in _FACTORIES[:6]}
"""``torch.zeros_like`` ... ``torch.randn_like``, and the factory each is by a shape."""
_WATCHED = _SIZE_TAKERS | frozenset(_LIKE)
_TENSOR_SIZES = frozenset(named("ctc_loss"))
"""Functions that take their sizes as tensors (or ints): given a lazy one, its value."""


def _number(rec: Recorder, value: Any, tensor: bool) -> Any:
    """``value`` with each 0-d integer lazy value in it (or in a tuple or list) read, as a
    Python int (or as its tensor)."""
    if type(value) is Lazy and not value.shape and _integer(value.dtype):
        read = rec.read(value, "a size", pause=False)
        return read.detach() if tensor else int(read)
    if type(value) in (tuple, list) and any(type(v) is Lazy for v in value):
        numbers = [_number(rec, v, tensor) for v in value]
        return tuple(numbers) if type(value) is tuple else numbers
    return value


def _integer(dtype: torch.dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex or dtype is torch.bool)


def read_numbers(
    rec: Recorder, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """``args`` and ``kwargs`` with each 0-d lazy value that PyTorch's ``func`` takes as a
    number (a dim, a count, a slope: where no overload of its ATen op takes a tensor) read, as
    eager reads it; ``None`` where there is none. A lazy value there was taken as a tensor
    operand, the op recorded with a stand-in's number (``h.unsqueeze(d)``: the wrong shape)."""
    name = getattr(func, "__name__", "")
    if all(getattr(space, name, None) is not func for space in (torch.Tensor, torch, F)):
        return None  # not PyTorch's own: its arguments are not its ATen op's
    positions, names = _number_slots(name)
    hit = [i for i, a in enumerate(args) if i in positions and _holds_0d(a)]
    keys = [k for k, v in kwargs.items() if k in names and _holds_0d(v)]
    if not hit and not keys:
        return None
    for value in [*(args[i] for i in hit), *(kwargs[k] for k in keys)]:
        for lazy in value if type(value) in (tuple, list) else (value,):
            if type(lazy) is Lazy and lazy.requires_grad:  # eagerly: "must be Number"
                raise TypeError(
                    f"{name}(): an argument that takes a number got a tensor that requires "
                    "grad, whose gradient would be lost: must be Number, not Tensor (as in "
                    "eager PyTorch)"
                )
    read = lambda v: _read(rec, v)  # noqa: E731
    args = tuple(read(a) if i in hit else a for i, a in enumerate(args))
    return args, {k: read(v) if k in keys else v for k, v in kwargs.items()}


_NUMBER_SLOTS: dict[str, tuple[frozenset[int], frozenset[str]]] = {}


def _number_slots(name: str) -> tuple[frozenset[int], frozenset[str]]:
    """The positions and keywords of ``aten::name``'s arguments that take no tensor in any
    overload on a tensor."""
    found = _NUMBER_SLOTS.get(name)
    if found is None:
        schemas = [
            [(a.name, str(a.type)) for a in schema.arguments]
            for schema in torch._C._jit_get_schemas_for_operator(f"aten::{name}")
            if schema.arguments and str(schema.arguments[0].type) == "Tensor"
        ]
        numbers = lambda types: bool(types) and all("Tensor" not in t for t in types)  # noqa: E731
        width = max(map(len, schemas), default=0)
        positions = {
            i for i in range(1, width) if numbers([s[i][1] for s in schemas if len(s) > i])
        }
        every = {n for s in schemas for n, _ in s[1:]}
        keywords = {n for n in every if numbers([t for s in schemas for m, t in s if m == n])}
        found = _NUMBER_SLOTS[name] = (frozenset(positions), frozenset(keywords))
    return found


def _holds_0d(value: Any) -> bool:
    if type(value) is Lazy:
        return not value.shape
    return type(value) in (tuple, list) and any(type(v) is Lazy and not v.shape for v in value)


def _read(rec: Recorder, value: Any) -> Any:
    if type(value) is Lazy and not value.shape:
        return rec.read(value, "a number", pause=False).item()
    if type(value) is tuple:
        return tuple(_read(rec, v) for v in value)
    if type(value) is list:
        return [_read(rec, v) for v in value]
    return value
