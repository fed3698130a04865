"""Calls that only ask about a lazy value's dtype, rank or size answer at once, as eagerly;
NumPy conversion and number formatting read the value, as eagerly.

``torch.is_floating_point(mask)`` (``nn.MultiheadAttention`` asks it of a key padding mask),
``x.ndimension()`` (``torch.distributions`` asks it) and their kin were recorded as ops and
refused, since they return no tensor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import batchfold as bf
from batchfold.lazy.dispatch import ORIGINAL_IS_TENSOR
from batchfold.schedule import Scheduler
from reference import assert_matches_eager

SCHEDULERS = ["agenda", "depth"]
_QUERIES: dict[str, Callable[[torch.Tensor], Any]] = {
    "torch.is_floating_point": torch.is_floating_point,
    "is_floating_point": lambda x: x.is_floating_point(),
    "torch.is_complex": torch.is_complex,
    "is_complex": lambda x: x.is_complex(),
    "torch.is_signed": torch.is_signed,
    "is_signed": lambda x: x.is_signed(),
    "ndimension": lambda x: x.ndimension(),
    "nelement": lambda x: x.nelement(),
    "torch.numel": torch.numel,
    "element_size": lambda x: x.element_size(),
    "get_device": lambda x: x.get_device(),
}


@pytest.mark.parametrize("query", list(_QUERIES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.uint8])
def test_a_query_answers_as_eagerly(query: str, dtype: torch.dtype) -> None:
    ask = _QUERIES[query]
    xs = [torch.ones(n, 3, dtype=dtype) for n in (2, 4)]

    def fn(x: torch.Tensor) -> Any:
        return ask(torch.as_tensor(x) * 1)  # a value computed inside

    got = bf.batch_map(fn, xs)
    assert got == [ask(x * 1) for x in xs]


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_attention_with_a_key_padding_mask_made_inside(scheduler: Scheduler) -> None:
    torch.manual_seed(0)
    attention = nn.MultiheadAttention(8, 2, batch_first=True).double()
    sequences = [torch.randn(n, 8, dtype=torch.float64) for n in (3, 1, 5, 4)]

    def attend(s: torch.Tensor) -> torch.Tensor:
        x = torch.as_tensor(s)
        mask = torch.arange(x.shape[0]) > 1  # keys after the second are padding
        return attention(x, x, x, key_padding_mask=mask, need_weights=False)[0]

    assert_matches_eager(attend, sequences, attention, scheduler)


@pytest.mark.filterwarnings("ignore:__array__ implementation doesn't accept a copy")  # a tensor's
def test_numpy_conversion_and_formatting_read_the_value_as_eagerly() -> None:
    """``np.asarray(x)`` wrapped the lazy object in an array of objects (its sum came back a
    lazy tensor, where eagerly a NumPy number); ``f"{loss:.3f}"`` raised a TypeError."""
    xs = [torch.randn(4, 3) for _ in range(3)]
    got = bf.batch_map(
        lambda x: (np.asarray(torch.as_tensor(x) * 2), f"{torch.as_tensor(x).sum():.3f}"), xs
    )
    for (array, text), x in zip(got, xs, strict=True):
        assert isinstance(array, np.ndarray) and array.dtype == np.float32
        np.testing.assert_array_equal(array, np.asarray(x * 2))
        assert text == f"{x.sum():.3f}"
    weight = nn.Parameter(torch.ones(3))
    with pytest.raises(RuntimeError, match="requires grad"):  # as eagerly
        bf.batch_map(lambda x: np.asarray(torch.as_tensor(x) * weight), xs)
    with pytest.raises(TypeError, match="unsupported format string"):  # as eagerly
        bf.batch_map(lambda x: f"{torch.as_tensor(x) * 1:.3f}", xs)
    with pytest.raises(ValueError, match="avoid copy"):  # as NumPy answers a tensor
        np.asarray(xs[0], copy=False)
    with pytest.raises(ValueError, match="avoid copy"):
        bf.batch_map(lambda x: np.asarray(torch.as_tensor(x) * 2, copy=False), xs)


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_a_decoder_layer_with_a_causal_mask_made_inside(scheduler: Scheduler) -> None:
    """The layer asks ``F._none_or_dtype`` of its mask, which refused a lazy one."""
    torch.manual_seed(0)
    layer = nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=True).double()
    sequences = [torch.randn(n, 8, dtype=torch.float64) for n in (3, 1, 5, 4)]

    def decode(s: torch.Tensor) -> torch.Tensor:
        x = torch.as_tensor(s)
        causal = nn.Transformer.generate_square_subsequent_mask(x.shape[0], dtype=x.dtype)
        bool_causal = torch.triu(torch.ones(x.shape[0], x.shape[0], dtype=torch.bool), 1)
        return layer(x, x[:2], tgt_mask=causal) + layer(x, x, tgt_mask=bool_causal)

    assert_matches_eager(decode, sequences, layer, scheduler)


def test_torch_is_tensor_of_a_lazy_value_is_true_as_eagerly() -> None:
    """A branch on it took the other way; ``isinstance(x, torch.Tensor)`` stays false (see the
    README), and ``torch.is_tensor`` is PyTorch's again after the run."""
    xs = [torch.randn(3) for _ in range(2)]
    got = bf.batch_map(lambda x: torch.is_tensor(torch.as_tensor(x) * 2), xs)
    assert got == [True, True]
    assert torch.is_tensor is ORIGINAL_IS_TENSOR
    assert not torch.is_tensor(object()) and torch.is_tensor(xs[0])
