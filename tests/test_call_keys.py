"""Keys of recorded calls keep apart arguments that compare equal but compute differently:
-0.0 and 0.0, equal numbers of two types inside objects (namedtuples, frozensets, frozen
dataclasses), enum members of two classes, and a default dtype set inside the function."""

from __future__ import annotations

import dataclasses
import enum
from collections import namedtuple
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import batchfold as bf

XS = [torch.tensor([1.0, 2.0], dtype=torch.float64) * (i + 1) for i in range(4)]


class _Branches(nn.Module):
    """A forward whose Python branch reads its argument's type or identity."""

    def forward(self, x: torch.Tensor, a: Any) -> torch.Tensor:
        if isinstance(a, (float, np.floating)) or (isinstance(a, tuple) and type(a[0]) is float):
            return x * 2
        if isinstance(a, _Frozen) and type(a.a) is float:
            return x * 3
        if a is _First.A:
            return x + 1
        if isinstance(a, frozenset) and 1.0 in a and any(type(v) is float for v in a):
            return x - 1
        return x * 0 - 4


class _First(enum.IntEnum):
    A = 1


class _Second(enum.IntEnum):
    B = 1


_Pair = namedtuple("_Pair", "a b")


@dataclasses.dataclass(frozen=True)
class _Frozen:
    a: Any
    b: Any


def _check(fn: Any, args: list[Any]) -> None:
    items = list(zip(XS, args, strict=True))
    got = bf.batch_map(fn, items)
    for g, item in zip(got, items, strict=True):
        torch.testing.assert_close(g, fn(item))


@pytest.mark.parametrize(
    "args",
    [
        [0.0, 0.0, -0.0, -0.0],
        [np.float64(0.0), np.float64(0.0), np.float64(-0.0), np.float64(-0.0)],
        [0j, 0j, complex(-0.0, 0.0), complex(-0.0, 0.0)],
        [np.int64(1), np.int64(1), np.float64(1.0), np.float64(1.0)],
        [_Pair(1, 2), _Pair(1, 2), _Pair(1.0, 2), _Pair(1.0, 2)],
        [frozenset({1}), frozenset({1}), frozenset({1.0}), frozenset({1.0})],
        [_Second.B, _Second.B, _First.A, _First.A],
        [_Frozen(1, (2,)), _Frozen(1, (2,)), _Frozen(1.0, (2,)), _Frozen(1.0, (2,))],
    ],
    ids=[
        "signed zeros",
        "numpy zeros",
        "complex zeros",
        "numpy scalars",
        "namedtuples",
        "frozensets",
        "int enums",
        "dataclasses",
    ],
)
def test_equal_arguments_that_compute_differently_are_keyed_apart(args: list[Any]) -> None:
    """The first instances' cached call (or op) was replayed for the later ones, whose
    arguments compare equal to the first's: ``1 / -0.0`` is ``-inf``, and the forward's
    branch reads the type."""
    module = _Branches()
    _check(lambda item: module(torch.as_tensor(item[0]), item[1]), args)
    if isinstance(args[0], (float, np.floating)):  # an op's own signature, no module
        _check(lambda item: torch.as_tensor(item[0]) / item[1], args)
        _check(lambda item: torch.div(torch.as_tensor(item[0]), other=item[1]), args)


def test_setting_the_default_dtype_inside_the_function_is_refused() -> None:
    """Calls recorded under one default dtype were replayed for instances that set another
    (a module's ``x * 0.5`` of integers came back float32 where eager gives float64)."""
    halve = nn.Module()
    halve.forward = lambda x: x * 0.5  # type: ignore[method-assign]
    ints = [torch.tensor([3, 5]) * (i + 1) for i in range(4)]

    def fn(item: tuple[torch.Tensor, bool]) -> torch.Tensor:
        old = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64 if item[1] else torch.float32)
        try:
            return halve(torch.as_tensor(item[0]))
        finally:
            torch.set_default_dtype(old)

    items = list(zip(ints, [False, False, True, True], strict=True))
    with pytest.raises(bf.UnsupportedOpError, match="set_default_dtype"):
        bf.batch_map(fn, items)
    assert torch.get_default_dtype() == torch.float32
    # set before batch_map, it holds for every instance
    torch.set_default_dtype(torch.float64)
    try:
        got = bf.batch_map(lambda x: halve(torch.as_tensor(x)), ints)
        assert all(g.dtype == torch.float64 for g in got)
    finally:
        torch.set_default_dtype(torch.float32)


class _Scaler:
    t = 1.0

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.t


class _Apply(nn.Module):
    def forward(self, x: torch.Tensor, act: Any) -> Any:
        return x * act.t if isinstance(act, type) else act(x)


def test_a_bound_method_or_a_class_given_to_a_module_is_read_as_it_is_now() -> None:
    # keyed as code, by value: the later calls replayed the first one's scale, where the
    # function set the object's (or the class's) attribute per instance
    module, scaler = _Apply(), _Scaler()

    def fn(item: tuple[torch.Tensor, float]) -> Any:
        scaler.t = _Scaler.t = item[1]
        x = torch.as_tensor(item[0])
        return module(x, scaler.apply), module(x, _Scaler)

    items = [(x, t) for x, t in zip(XS, (1.0, 1.0, 2.0, 4.0), strict=False)]
    for got, item in zip(bf.batch_map(fn, items), items, strict=True):
        for g, w in zip(got, fn(item), strict=True):
            torch.testing.assert_close(g, w)


class _Node:
    """A tree node equal to another by its index alone, as a memo key."""

    def __init__(self, index: int, word: int) -> None:
        self.index, self.word = index, word

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Node) and self.index == other.index

    def __hash__(self) -> int:
        return hash(self.index)


class _Token(str):
    """A word that carries its part of speech."""

    pos = "N"


class _ReadsMore(nn.Module):
    def forward(self, x: torch.Tensor, obj: Any) -> torch.Tensor:
        if isinstance(obj, _Node):
            return x * obj.word
        return x * (2.0 if obj.pos == "V" else 3.0)


def test_a_users_object_equal_by_part_of_its_state_is_not_a_key() -> None:
    # node 0 of one tree took the call of node 0 of another (equal by index), and a str
    # subclass the call of an equal word with another part of speech
    module = _ReadsMore()
    verb = _Token("run")
    verb.pos = "V"
    args = [_Node(0, 1), _Node(0, 1), _Node(0, 5), _Token("run"), _Token("run"), verb]
    items = list(zip([*XS, *XS[:2]], args, strict=True))
    fn = lambda item: module(torch.as_tensor(item[0]), item[1])  # noqa: E731
    for got, item in zip(bf.batch_map(fn, items), items, strict=True):
        torch.testing.assert_close(got, fn(item))
