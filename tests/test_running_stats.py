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
from typing import Any, cast

import numpy as np
import pytest
import torch
import torch.nn.functional as F
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


def _buffers(norm: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    return cast(torch.Tensor, norm.running_mean), cast(torch.Tensor, norm.running_var)


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
)
def test_batch_norm_called_a_varying_number_of_times(
    lengths: list[int], calls: list[int], momentum: float | None, scheduler: str
) -> None:
    """Each instance calls the layer its own number of times (its calls land in steps of
    their own depth, and lengths of 0 move nothing)."""

    def fn(m: nn.Module, item: tuple[torch.Tensor, int]) -> torch.Tensor:
        x, count = item
        h = torch.as_tensor(x)
        for _ in range(count):
            h = torch.tanh(m(h)) + h
        return h

    xs = [(x, calls[i]) for i, x in enumerate(_rows(lengths))]
    _compare(lambda: nn.BatchNorm1d(3, momentum=momentum), fn, xs, scheduler)


class _Shared(nn.Module):
    """Two layers that share their running mean only (a buffer moved by both, in turns)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.BatchNorm1d(3, momentum=0.3), nn.BatchNorm1d(3)
        self.b.running_mean = self.a.running_mean

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)) * 2 - 1)


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_a_buffer_two_layers_share_moves_in_eager_order(scheduler: str) -> None:
    _compare(_Shared, lambda m, x: m(torch.as_tensor(x)), _rows([3, 5, 2, 4]), scheduler)


def test_functional_forms_with_a_shared_input_or_keywords() -> None:
    """A shared input with a per-instance weight moves the buffers once per instance (it was
    run once and memoised); ``torch.batch_norm`` takes its arguments by keyword too."""
    shared = torch.randn(5, 3) * 2 + 1
    _compare(
        lambda: nn.BatchNorm1d(3),
        lambda m, x: F.batch_norm(shared, *_buffers(m), torch.as_tensor(x)[0], training=True),
        _rows([3, 4, 2]),
        "agenda",
    )
    _compare(
        lambda: nn.BatchNorm1d(3),
        lambda m, x: torch.batch_norm(
            torch.as_tensor(x),
            None,
            None,
            running_mean=_buffers(m)[0],
            running_var=_buffers(m)[1],
            training=True,
            momentum=0.2,
            eps=1e-5,
            cudnn_enabled=False,
        ),
        _rows([3, 4, 2]),
        "agenda",
    )
    norm = nn.BatchNorm1d(3)
    with pytest.raises(ValueError, match="both be None or neither"):  # as eagerly
        bf.batch_map(
            lambda x: F.batch_norm(torch.as_tensor(x), norm.running_mean, None, training=True),
            _rows([3]),
        )


def test_float32_inputs_far_from_zero_keep_eager_gradients() -> None:
    """vmap's batched backward rounded a weight's gradient 30% off here; the instances now
    run as more channels of one call of the kernel."""
    torch.set_default_dtype(torch.float32)
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(500, 3, generator=gen) * 3 + 100 for _ in range(4)]
    eager = nn.BatchNorm1d(3)
    batched = copy.deepcopy(eager)
    weights = torch.arange(1500.0).view(500, 3)
    want = torch.stack([(eager(x) * weights).sum() for x in xs]).sum()
    got = bf.batch_map(lambda x: (batched(torch.as_tensor(x)) * weights).sum(), xs)
    (want_grad,) = torch.autograd.grad(want, eager.weight)
    (got_grad,) = torch.autograd.grad(torch.stack(got).sum(), batched.weight)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-4, atol=1e-3)


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


def _train_then_eval(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    h = norm.train()(torch.as_tensor(x))
    return norm.eval()(h)  # eagerly reads the statistics the call before moved


def _eval_then_train(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    h = norm.eval()(torch.as_tensor(x))  # the next instance's reads follow this one's move
    return norm.train()(h)


def _read_after(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return norm(torch.as_tensor(x)).sum() + _buffers(norm)[0].sum()


def _read_in_a_list_after(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return norm(torch.as_tensor(x)).sum() + torch.stack(_buffers(norm)).sum()


ALIASES = {}  # views of a layer's buffers taken outside the function (see the test)


def _alias_read_after(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return norm(torch.as_tensor(x)).sum(0) + ALIASES[id(norm)]


def _lazy_read_after(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return norm(torch.as_tensor(x)) + _buffers(norm)[1]


def _value_read_after(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    h = norm(torch.as_tensor(x))
    return h * 2 if float(h.detach().sum()) > 0 else h  # a sync point after a move


def _value_read_before(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    h = torch.as_tensor(x)
    h = h * 2 if float(h.sum()) > 0 else h  # instances then record in turns
    return norm(h)


@pytest.mark.parametrize(
    "fn, match",
    [
        (_train_then_eval, "evaluation mode at .* uses running statistics"),
        (_eval_then_train, "reads running statistics"),  # one instance: the read came first
        (_read_after, "uses running statistics"),
        (_read_in_a_list_after, "uses running statistics"),
        (_alias_read_after, "running statistics that a batch_norm call"),
        (_lazy_read_after, "running statistics that a batch_norm call"),
        (_value_read_after, "reads a value after a normalisation"),
        (_value_read_before, "after a value read"),
    ],
)
def test_other_uses_of_moved_buffers_and_sync_points_are_refused(
    fn: Callable[[nn.Module, torch.Tensor], torch.Tensor], match: str
) -> None:
    """Eagerly each sees the buffers moved, partly moved or moved in another order."""
    norm = nn.BatchNorm1d(3)
    ALIASES[id(norm)] = _buffers(norm)[0].view(3).detach()  # the same memory, another object
    lengths = [3] if fn is _eval_then_train else [3, 4, 2]
    with pytest.raises(UnsupportedOpError, match=match):
        bf.batch_map(lambda x: fn(norm, x), _rows(lengths))


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


def test_moving_the_buffers_keeps_their_versions_as_eager_kernels_do() -> None:
    """An eager call that autograd saved the buffers for still runs its backward after a
    batch_map moved them (a version bump made it fail), as after eager calls."""
    norm = nn.BatchNorm1d(2)
    x = torch.tensor([[0.0, 1.0], [2.0, 5.0]], requires_grad=True)
    before = norm(x * 2)
    after = bf.batch_map(lambda v: norm(torch.as_tensor(v) * x), [[[1.0, 1.0], [2.0, 3.0]]])
    (before.sum() + after[0].sum()).backward()
    assert x.grad is not None


def test_momentum_as_a_numpy_number_or_a_tensor() -> None:
    for momentum in (np.float32(0.3), torch.tensor(0.3), 1):
        _compare(
            lambda m=momentum: nn.BatchNorm1d(3, momentum=m),  # type: ignore[arg-type]
            lambda m, x: m(torch.as_tensor(x)),
            _rows([3, 4]),
            "agenda",
        )
