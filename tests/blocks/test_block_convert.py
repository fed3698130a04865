"""``convert_to_block``: the converters registered by the modules that define blocks."""

from __future__ import annotations

from typing import NamedTuple

import pytest
import torch
from torch import nn

from batchfold.blocks import (
    FromTensor,
    Function,
    Identity,
    Pipe,
    Record,
    Scalar,
    convert_to_block,
)


class Pair(NamedTuple):
    a: object
    b: object


def test_blocks_stay() -> None:
    block = Identity()
    assert convert_to_block(block) is block


def test_values_convert_by_their_most_specific_class() -> None:
    assert isinstance(convert_to_block((Identity(), Scalar())), Record)
    assert isinstance(convert_to_block([Identity()]), Record)
    assert isinstance(convert_to_block({"x": Identity()}), Record)
    assert isinstance(convert_to_block(Pair(Identity(), Identity())), Record)  # a tuple
    assert isinstance(convert_to_block(nn.Linear(2, 3)), Function)
    assert isinstance(convert_to_block(torch.zeros(2)), FromTensor)
    assert isinstance(convert_to_block(nn.Parameter(torch.zeros(2))), FromTensor)


def test_other_values_are_refused() -> None:
    with pytest.raises(TypeError, match="cannot use .* as a block"):
        convert_to_block(3)


def test_block_methods_find_their_constructors() -> None:
    assert isinstance(Scalar() >> Identity(), Pipe)
    assert isinstance((Identity(), Identity()) >> Identity(), Pipe)
    assert (Scalar() >> nn.Identity()).eval(2.0).item() == 2.0
