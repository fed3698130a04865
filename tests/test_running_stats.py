"""Normalisation layers in training mode inside ``batch_map``: outputs, gradients and the
running statistics they move equal eager PyTorch's, for calls of several shapes, several calls
per instance, calls after value reads (sync points), ``momentum=None`` and instance
normalisation with running statistics. Calls of several shapes, or of one layer twice in an
instance, once moved the buffers in the batch's order, not eager's: silently other statistics
for every later evaluation (``batchfold.lazy.running_stats``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import batchfold as bf
from batchfold.errors import UnsupportedOpError

pytestmark = pytest.mark.usefixtures("float64")
SCHEDULERS = ["agenda", "depth"]


def _compare(
    make: Callable[[], nn.Module],
    fn: Callable[[nn.Module, Any], torch.Tensor],
    xs: list[Any],
    scheduler: str,
) -> None:
    """``fn`` on each instance eagerly and through batch_map, each on its own copy of one
    module: outputs, the gradients of their sum, and every buffer afterwards."""
    torch.manual_seed(0)
    eager = make()
    batched = copy.deepcopy(eager)
    want = [fn(eager, x) for x in xs]
    got = bf.batch_map(lambda x: fn(batched, x), xs, scheduler=scheduler)  # type: ignore[arg-type]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    want_loss, got_loss = (torch.stack([v.sum() for v in vs]).sum() for vs in (want, got))
    assert got_loss.requires_grad == want_loss.requires_grad
    if want_loss.requires_grad:  # no call of the module: nothing to differentiate
        want_loss.backward()
        got_loss.backward()
        for (name, p), q in zip(eager.named_parameters(), batched.parameters(), strict=True):
            torch.testing.assert_close(q.grad, p.grad, msg=name)
    for (name, b), c in zip(eager.named_buffers(), batched.buffers(), strict=True):
        torch.testing.assert_close(c, b, msg=name)


def _rows(lengths: list[int], width: int = 3) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(sum(lengths) + len(lengths))
    return [torch.randn(n, width, generator=gen) * 2 + 1 for n in lengths]


@pytest.mark.parametrize("scheduler", SCHEDULERS)
@pytest.mark.parametrize("momentum", [0.1, None])
def test_batch_norm_on_rows_of_several_lengths(scheduler: str, momentum: float | None) -> None:
    """Rows of no length move nothing, as eagerly, but count (``momentum=None``)."""
    _compare(
        lambda: nn.BatchNorm1d(3, momentum=momentum),
        lambda m, x: m(torch.as_tensor(x)),
        _rows([3, 5, 0, 2, 5, 4]),
        scheduler,
    )


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 6).filter(lambda n: n != 1), min_size=1, max_size=6),
    calls=st.lists(st.integers(0, 3), min_size=6, max_size=6),
    momentum=st.sampled_from([0.1, 0.5, None]),
    scheduler=st.sampled_from(SCHEDULERS),
    read=st.booleans(),
)
def test_batch_norm_called_a_varying_number_of_times(
    lengths: list[int], calls: list[int], momentum: float | None, scheduler: str, read: bool
) -> None:
    """Each instance calls the layer its own number of times; with ``read`` each call
    follows a value read, so the instances record in turns (the sync points' order)."""

    def fn(m: nn.Module, item: tuple[torch.Tensor, int]) -> torch.Tensor:
        x, count = item
        h = torch.as_tensor(x)
        for _ in range(count):
            if read and float(h.detach().sum()) > 1e9:  # never true: a read, a sync point
                h = h * 2
            h = torch.tanh(m(h)) + h
        return h

    xs = [(x, calls[i]) for i, x in enumerate(_rows(lengths))]
    _compare(lambda: nn.BatchNorm1d(3, momentum=momentum), fn, xs, scheduler)


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_instance_norm_with_running_statistics(scheduler: str) -> None:
    _compare(
        lambda: nn.InstanceNorm1d(3, affine=True, track_running_stats=True),
        lambda m, x: m(torch.as_tensor(x).T.unsqueeze(0)) * 2,
        _rows([3, 5, 2, 5]) * 2,
        scheduler,
    )


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin, self.norm = nn.Linear(3, 3), nn.BatchNorm1d(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.norm(self.lin(x)))


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_a_module_holding_batch_norm_is_never_cached(scheduler: str) -> None:
    """A cached call would not move the statistics again: the module runs every call."""
    _compare(_Block, lambda m, x: m(m(torch.as_tensor(x))), _rows([4, 4, 3, 4, 4, 2]), scheduler)
    block = _Block()
    stats = bf.batch_map(lambda x: block(torch.as_tensor(x)), _rows([4, 4, 4]), return_stats=True)[
        1
    ]
    assert stats.module_calls_cached == 0


def test_evaluation_after_training_in_one_batch_is_refused() -> None:
    norm = nn.BatchNorm1d(3)

    def fn(x: torch.Tensor) -> torch.Tensor:
        h = norm.train()(torch.as_tensor(x))
        return norm.eval()(h)  # eagerly reads the statistics the call before moved

    with pytest.raises(UnsupportedOpError, match="evaluation mode reads running statistics"):
        bf.batch_map(fn, _rows([3, 4]))
    norm.train()


def test_one_value_per_channel_raises_as_eagerly() -> None:
    norm = nn.BatchNorm1d(3)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        norm(torch.randn(1, 3))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        bf.batch_map(lambda x: norm(torch.as_tensor(x)), _rows([2, 1]))


def test_evaluation_mode_reads_the_statistics_and_moves_nothing() -> None:
    _compare(
        lambda: nn.BatchNorm1d(3).eval(),
        lambda m, x: m(torch.as_tensor(x)),
        _rows([3, 2]),
        "agenda",
    )


def test_a_block_function_refuses_to_move_statistics() -> None:
    """A block graph has no batch_map end to move them at."""
    from batchfold.blocks import Function, Vector, compile

    norm = nn.BatchNorm1d(2)
    model = compile(Vector(4) >> Function(lambda h: norm(h.view(2, 2)).sum(), per_instance=True))
    with pytest.raises(UnsupportedOpError, match="inside a block Function"):
        model([[1.0, -2.0, 0.5, 3.0]])
    norm.eval()
    model([[1.0, -2.0, 0.5, 3.0]])  # evaluation mode reads the statistics: recorded as any op
