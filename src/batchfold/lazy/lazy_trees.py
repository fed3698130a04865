"""Walks over the nested structures that hold lazy values: a call's arguments, a traced
call's result, ``batch_map``'s results.

Plain lists, tuples and dicts (and dataclasses, for results) are walked here, which is faster
than ``torch.utils._pytree`` for the common small structures and leaves no garbage cycle.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from typing import Any

import torch
from torch import Tensor
from torch.utils._pytree import tree_map

from ..errors import UnsupportedOpError
from .tensor import Lazy

_LEAVES = frozenset([int, float, bool, complex, str, bytes, type(None), torch.Size])


def has_lazy(args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> bool:
    """Whether a call's arguments hold a :class:`Lazy` (directly or in a flat list)."""
    for a in args:
        if type(a) is Lazy:
            return True
        if type(a) in (list, tuple) and any(type(b) is Lazy for b in a):
            return True
    return bool(kwargs) and any(
        type(v) is Lazy or (type(v) in (list, tuple) and any(type(b) is Lazy for b in v))
        for v in kwargs.values()  # type: ignore[union-attr]
    )


def flatten_lazies(result: Any, outs: list[Lazy]) -> Any:
    """Append the lazy tensors of a call's result to ``outs``; its nesting, for :func:`build`.

    ``None`` for one tensor, ``(tuple or list, nestings)`` for non-empty tuples and lists of
    them (``nn.LSTM``'s ``(output, (h, c))``), ``False`` for anything else.
    """
    kind = type(result)
    if kind is Lazy:
        outs.append(result)
        return None
    if (kind is tuple or kind is list) and result:
        parts = tuple(flatten_lazies(item, outs) for item in result)
        return False if any(p is False for p in parts) else (kind, parts)
    return False


def build(structure: Any, outs: list[Any]) -> Any:
    """A call's result from its lazy tensors in order and the nesting :func:`flatten_lazies` gave."""
    return outs[0] if structure is None else _build(structure, iter(outs))


def _build(structure: Any, outs: Any) -> Any:
    if structure is None:
        return next(outs)
    kind, parts = structure
    return kind(_build(p, outs) for p in parts)


def map_lazies(fn: Any, obj: Any, results: bool = False, tensors: Any = None) -> Any:
    """``obj`` with ``fn`` applied to each lazy value in it: plain lists, tuples, dicts and
    dataclasses walked here (the common results, fast), other containers by ``tree_map``.
    With ``results`` (``batch_map``'s), a lazy value in an attribute of an object neither
    walks is refused: it would come back lazy, unusable. ``tensors`` (if given) is applied
    to the tensors that are not lazy in the lists, tuples, dicts and dataclasses."""
    kind = type(obj)
    if kind is Lazy:
        return fn(obj)
    if kind is list or kind is tuple:
        return kind([map_lazies(fn, x, results, tensors) for x in obj])
    if kind is dict:
        return {k: map_lazies(fn, v, results, tensors) for k, v in obj.items()}
    if kind in _LEAVES:
        return obj  # tree_map leaves a cycle to collect on every call (a recursive helper)
    if isinstance(obj, Tensor):
        return obj if tensors is None else tensors(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):  # not walked by tree_map
        new = copy.copy(obj)
        for field in dataclasses.fields(obj):  # frozen ones too, as their __init__ sets them
            value = map_lazies(fn, getattr(obj, field.name), results, tensors)
            object.__setattr__(new, field.name, value)
        return new
    if results:
        tree_map(_refuse_hidden, obj)
    return tree_map(lambda x: fn(x) if type(x) is Lazy else x, obj)


def _refuse_hidden(leaf: Any) -> None:
    if isinstance(leaf, (list, tuple, dict)) and _holds_lazy(leaf):  # a subclass: a leaf
        raise UnsupportedOpError(
            f"the function given to batch_map returned a {type(leaf).__name__} (a subclass "
            f"of {next(b for b in (list, tuple, dict) if isinstance(leaf, b)).__name__}) "
            "holding lazy values, which batch_map "
            "cannot rebuild with their tensors: return a plain list, tuple or dict."
        )
    if inspect.isgenerator(leaf) or inspect.iscoroutine(leaf):
        raise UnsupportedOpError(
            f"the function given to batch_map returned a {type(leaf).__name__}: the lazy "
            "values it yields later could not be replaced by their tensors. Return a list."
        )
    cells = getattr(leaf, "__closure__", None) or ()
    if callable(leaf) and any(type(_contents(cell)) is Lazy for cell in cells):
        raise UnsupportedOpError(
            "the function given to batch_map returned a function holding a lazy value in its "
            "closure, which batch_map cannot replace by its tensor: return the tensor, or "
            "the function's result."
        )
    for name, value in getattr(leaf, "__dict__", {}).items():
        if type(value) is Lazy:
            raise UnsupportedOpError(
                f"the function given to batch_map returned a {type(leaf).__name__} holding a "
                f"lazy value in its attribute {name!r}; batch_map replaces lazy values by "
                "their tensors in lists, tuples, dicts, named tuples and dataclasses only. "
                "Return the tensors in one of those (or make the class a dataclass)."
            )


def _holds_lazy(obj: Any) -> bool:
    items = obj.values() if isinstance(obj, dict) else obj
    return any(
        type(x) is Lazy or (isinstance(x, (list, tuple, dict)) and _holds_lazy(x)) for x in items
    )


def _contents(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # a cell not filled yet
        return None
