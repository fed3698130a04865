"""Ops that return ``None`` among their tensors record inside ``batch_map``.

``nn.MultiheadAttention`` with ``need_weights=False`` (as ``nn.TransformerEncoderLayer`` calls
it) returns ``(output, None)`` from one function; such a call was refused, so no Transformer
layer ran per instance. Its node now computes the tensors alone and the caller gets the
``None`` back where eager PyTorch gives it.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from batchfold.schedule import Scheduler
from reference import assert_matches_eager

SCHEDULERS = ["agenda", "depth"]
pytestmark = [
    pytest.mark.usefixtures("float64"),
    pytest.mark.filterwarnings("ignore:There is a performance drop"),  # vmap of SDPA
]


def _sequences() -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.randn(length, 8) for length in (3, 1, 5, 4)]


@pytest.mark.parametrize("scheduler", SCHEDULERS)
@pytest.mark.parametrize("train", [True, False])
def test_a_transformer_layer_per_instance_matches_eager(scheduler: Scheduler, train: bool) -> None:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True).train(train)
    with torch.set_grad_enabled(train):
        stats = assert_matches_eager(
            lambda s: layer(torch.as_tensor(s) * 2),
            _sequences(),
            layer if train else None,
            scheduler,
        )
    assert stats.nodes > 0


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_attention_without_weights_gives_none_where_eager_does(scheduler: Scheduler) -> None:
    torch.manual_seed(0)
    attention = nn.MultiheadAttention(8, 2, batch_first=True)

    def attend(s: torch.Tensor) -> Any:
        x = torch.as_tensor(s) * 1
        out, weights = attention(x, x, x, need_weights=False)
        assert weights is None
        return out

    assert_matches_eager(attend, _sequences(), attention, scheduler)
