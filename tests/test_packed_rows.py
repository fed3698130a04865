"""Per-instance row indices turned into indices of packed rows (``ops_views.packed_rows``):
values against a loop over instances, the last results kept and reused only for the same,
unchanged index, and eager's ``IndexError`` for an index out of an instance's range."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import numpy as np
import pytest
import torch

import batchfold as bf
from batchfold.graph import Signature
from batchfold.ops_views import _ROWS_MEMO, packed_rows

SIG = cast(Signature, SimpleNamespace(name="index_select", site="here.py:1"))  # all it reads


def _case(seed: int, allow_negative: bool) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 8))
    rows = rng.integers(1, 6, size=n)
    counts = rng.integers(0, 5, size=n)
    low = -rows if allow_negative else np.zeros_like(rows)
    index = np.concatenate(
        [rng.integers(lo, r, size=c) for lo, r, c in zip(low, rows, counts, strict=True)]
    )
    return torch.from_numpy(index.astype(np.int64)), counts, rows


def _expected(index: torch.Tensor, counts: np.ndarray, rows: np.ndarray) -> list[int]:
    out, k, first = [], 0, 0
    for count, size in zip(counts.tolist(), rows.tolist(), strict=True):
        for i in index[k : k + count].tolist():
            out.append(first + (i + size if i < 0 else i))
        k, first = k + count, first + size
    return out


@pytest.mark.parametrize("allow_negative", [False, True])
@pytest.mark.parametrize("seed", range(20))
def test_rows_are_each_instances_rows_in_the_packed_order(seed: int, allow_negative: bool) -> None:
    index, counts, rows = _case(seed, allow_negative)
    got = packed_rows(SIG, index, counts, rows, allow_negative)
    assert got.tolist() == _expected(index, counts, rows)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_rows_on_the_gpu_equal_the_cpus() -> None:
    index, counts, rows = _case(3, True)
    got = packed_rows(SIG, index.cuda(), counts, rows, True)
    assert got.device.type == "cuda" and got.tolist() == _expected(index, counts, rows)


def test_a_result_is_reused_for_the_same_index_and_not_after_it_changed() -> None:
    index, counts, rows = torch.tensor([0, 1, 1, 0]), np.array([2, 2]), np.array([2, 3])
    first = packed_rows(SIG, index, counts, rows, False)
    assert packed_rows(SIG, index, counts, rows, False) is first  # read twice in one step
    assert packed_rows(SIG, index.clone(), counts, rows, False) is not first
    assert packed_rows(SIG, index, counts.copy(), rows, False) is not first
    index[3] = 2  # in place: the kept result is stale
    assert packed_rows(SIG, index, counts, rows, False).tolist() == [0, 1, 3, 4]
    assert first.tolist() == [0, 1, 3, 2]


@pytest.mark.parametrize(
    ("values", "allow_negative", "bad"),
    [([0, 3], False, 3), ([0, -1], False, -1), ([-4, 0], True, -4), ([1, 3], True, 3)],
)
def test_an_index_out_of_its_instances_range_is_eagers_index_error(
    values: list[int], allow_negative: bool, bad: int
) -> None:
    index, counts, rows = torch.tensor(values), np.array([1, 1]), np.array([2, 3])
    message = rf"index_select at here.py:1: index {bad} is out of range for an instance with"
    with pytest.raises(IndexError, match=message):
        packed_rows(SIG, index, counts, rows, allow_negative)


def test_inference_tensors_are_never_reused_and_a_run_forgets_what_it_kept() -> None:
    counts, rows = np.array([2, 2]), np.array([2, 3])
    with torch.inference_mode():
        index = torch.tensor([0, 1, 1, 0])
        first = packed_rows(SIG, index, counts, rows, False)
        index[3] = 2  # no version counter to see this by
        assert packed_rows(SIG, index, counts, rows, False).tolist() == [0, 1, 3, 4]
    assert first.tolist() == [0, 1, 3, 2]
    kept = torch.tensor([0, 1, 1, 0])
    packed_rows(SIG, kept, counts, rows, False)
    bf.batch_map(lambda x: torch.as_tensor(x) * 2, [torch.ones(2)])  # a plan runs, then forgets
    assert _ROWS_MEMO.__dict__.get("entries") is None
