"""``batch_map`` under ``torch.autocast``: the dtypes, values and gradients of eager autocast.

Autocast entered around ``batch_map`` holds while the batch runs, so every recorded op runs
under it; output dtypes are found by running each new kind of op on zeros on its device
(autocast's kernels pick them, which neither meta tensors nor shape rules know). Kept graphs
and traces serve only runs under the same autocast state and dtype. Entering autocast inside
the per-instance function is refused: the ops would run after the function has left it.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import batchfold as bf
from batchfold.errors import UnsupportedOpError
from batchfold.schedule import Scheduler
from reference import assert_grads_match, flat_tensors

TOL = 3e-2  # bfloat16 keeps 8 bits of mantissa; batched sums run in another order


class _Cell(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp, self.out = nn.Linear(4, 6), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.inp(x)))


def _model() -> _Cell:
    torch.manual_seed(0)
    return _Cell()


def _sequences() -> list[torch.Tensor]:
    torch.manual_seed(1)
    return [torch.randn(t, 4) for t in (1, 3, 5, 3, 2, 5)]


def _per_sequence(cell: _Cell) -> Any:
    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        rows = torch.as_tensor(x)  # [T, 4]
        h = cell(rows)  # a cached module call on rows of any length
        last = cell(rows[-1])  # one row: by shape
        pooled = h.sum(0) + last
        return pooled, torch.softmax(h, 0), rows.matmul(cell.inp.weight.t()).float()

    return fn


def _compare(fn: Any, model: nn.Module, scheduler: Scheduler, dtype: torch.dtype) -> None:
    params = list(model.parameters())
    with torch.autocast("cpu", dtype=dtype):
        eager = [fn(x) for x in _sequences()]
        batched = bf.batch_map(fn, _sequences(), scheduler=scheduler)
    want, got = flat_tensors(eager), flat_tensors(batched)
    assert len(want) == len(got)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape and g.requires_grad == w.requires_grad
        torch.testing.assert_close(g.float(), w.float(), rtol=TOL, atol=TOL)
    assert_grads_match(batched, eager, params, TOL)


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_batch_map_inside_autocast_gives_eagers_dtypes_and_values(scheduler: Scheduler) -> None:
    cell = _model()
    _compare(_per_sequence(cell), cell, scheduler, torch.bfloat16)


def test_runs_under_other_autocast_states_do_not_share_kept_graphs() -> None:
    cell = _model()
    fn = _per_sequence(cell)
    for dtype in (torch.bfloat16, torch.float16, torch.bfloat16):
        _compare(fn, cell, "agenda", dtype)
        plain = bf.batch_map(fn, _sequences())  # and without autocast, between them
        assert all(t.dtype == torch.float32 for t in flat_tensors(plain))


def test_entering_autocast_inside_the_function_is_refused() -> None:
    cell = _model()

    def fn(x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return cell(torch.as_tensor(x))

    with pytest.raises(UnsupportedOpError, match=r"torch.autocast entered at .*test_autocast"):
        bf.batch_map(fn, _sequences())


def test_an_autocast_that_changes_nothing_inside_the_function_records() -> None:
    cell = _model()

    def fn(x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", enabled=False):  # off already: nothing changes
            return cell(torch.as_tensor(x))

    got = bf.batch_map(fn, _sequences())
    for g, x in zip(got, _sequences(), strict=True):
        torch.testing.assert_close(g, fn(x))


def test_rows_of_any_length_under_autocast_batch_by_shape_with_eagers_dtypes() -> None:
    cell = _model()

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        rows = cell.inp(torch.as_tensor(x))  # [T, 6] in bfloat16
        weights = torch.softmax(rows[:, 0], 0)
        return weights @ rows, rows @ rows[0], rows.sum(0)

    _compare(fn, cell, "agenda", torch.float16)  # bfloat16's gradients differ by its rounding


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_sums_over_rows_of_any_length_add_up_as_eager(dtype: torch.dtype) -> None:
    items = [torch.ones(n, 3, dtype=dtype) * 0.5 for n in (1000, 600, 3)]

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        rows = torch.as_tensor(x)
        return rows.sum(), rows.mean(), rows.sum(0), rows[:, 0].sum()

    got, stats = bf.batch_map(fn, items, return_stats=True)
    assert stats.ragged_steps > 0
    for g, w in zip(flat_tensors(got), flat_tensors([fn(x) for x in items]), strict=True):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w)  # 1,000 halves add up to 500 (in bfloat16: 128)
