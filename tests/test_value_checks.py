"""Per-instance values that eager PyTorch reads inside an op, and checks: sizes given as 0-d
integer tensors, and indices that ``one_hot`` and ``index_fill`` check (their vmap rules do
not)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import batchfold as bf

XS = [torch.tensor([2.0, 1.0, 3.0]), torch.tensor([1.0, 3.0, 0.0]), torch.tensor([3.0, 0.0, 2.0])]

SIZED: dict[str, Callable[[Any, Any], Any]] = {  # (x, n): n a 0-d per-instance int64
    "zeros(n)": lambda x, n: torch.zeros(n) + x.sum(),
    "zeros((n, 2))": lambda x, n: torch.zeros((n, 2)) + x[0],
    "arange(n)": lambda x, n: torch.arange(n) * x[1],
    "full((n,), 1.5)": lambda x, n: torch.full((n,), 1.5) * x[2],
    "eye(n)": lambda x, n: torch.eye(n) * x[0],
    "new_ones(n, 2)": lambda x, n: x.new_ones(n, 2) * x[1],
    "expand(n, 3)": lambda x, n: x.expand(n, 3) * 2,
    "repeat(n)": lambda x, n: x.repeat(n),
    "narrow(0, 0, n)": lambda x, n: x.narrow(0, 0, n) + 1,
    "torch.narrow(x, 0, 0, n)": lambda x, n: torch.narrow(x, 0, 0, n) + 1,
    "select(0, n - 1)": lambda x, n: x.select(0, n - 1) * 3,
    "view(n, -1)": lambda x, n: x.repeat(2).view(n * 0 + 2, -1),
}


@pytest.mark.parametrize("case", sorted(SIZED))
def test_a_size_given_as_a_per_instance_integer_tensor_is_its_value(case: str) -> None:
    """Eager reads the value (``__index__``); recorded as it was, the op took its shape from
    a placeholder (``x.expand(n, 3)`` came back ``[0, 3]``) or failed to stack."""
    make = SIZED[case]

    def fn(x: Any) -> torch.Tensor:
        x = torch.as_tensor(x)
        return make(x, x[0].long())

    got, stats = bf.batch_map(fn, XS, return_stats=True)
    for g, x in zip(got, XS, strict=True):
        torch.testing.assert_close(g, fn(x))
    assert stats.syncs >= 1  # the size was read, as int(n) would be


def test_a_size_as_a_separate_argument_is_refused_by_pytorch_not_a_crash() -> None:
    """``torch.ones(n, 2)`` with ``n`` lazy: PyTorch's parser refuses an object with
    ``__torch_function__`` among separate sizes (a TypeError); its read inside the parser
    used to pause the instance there and crash the process when the next one got there."""

    def fn(x: Any) -> torch.Tensor:
        x = torch.as_tensor(x)
        return torch.ones(x[0].long(), 2)

    with pytest.raises(TypeError):
        bf.batch_map(fn, XS)
    # written with int(n), it batches
    got = bf.batch_map(lambda x: torch.ones(int(torch.as_tensor(x)[0]), 2), XS)
    assert [tuple(g.shape) for g in got] == [(2, 2), (1, 2), (3, 2)]


@pytest.mark.parametrize(
    ("indices", "error"),
    [
        ([[0, 1], [3, 5], [1, 1]], "smaller than num_classes"),
        ([[0, 1], [-1, 2], [1, 1]], "non-negative"),
        ([[0, 1], [3, 2], [1, 1]], None),
    ],
)
def test_one_hot_checks_every_instances_classes(indices: list[list[int]], error: str | None):
    """vmap's one_hot left an out-of-range class a row of zeros."""

    def fn(x: Any) -> torch.Tensor:
        return F.one_hot(torch.as_tensor(x), 4)

    xs = [torch.tensor(i) for i in indices]
    if error is not None:
        with pytest.raises(RuntimeError, match=error):
            bf.batch_map(fn, xs)
    else:
        for g, x in zip(bf.batch_map(fn, xs), xs, strict=True):
            torch.testing.assert_close(g, fn(x))


@pytest.mark.parametrize("in_place", [False, True])
def test_index_fill_reads_each_instances_own_indices(in_place: bool) -> None:
    """vmap's index_fill put a negative index's fill into another instance's row, and one
    out of range went unreported."""

    def fn(x: Any) -> torch.Tensor:
        index = torch.as_tensor(x)
        out = torch.zeros(4)
        return out.index_fill_(0, index, 3.0) if in_place else out.index_fill(0, index, 3.0)

    xs = [torch.tensor([0, 1]), torch.tensor([3, -2]), torch.tensor([1, 1])]
    for g, x in zip(bf.batch_map(fn, xs), xs, strict=True):
        torch.testing.assert_close(g, fn(x))
    with pytest.raises(IndexError, match="out of bounds"):
        bf.batch_map(fn, [torch.tensor([0, 1]), torch.tensor([3, 5])])


KEYWORD_FORMS: dict[str, Callable[[Any], Any]] = {
    "argmax(keepdim=True)": lambda x: x.argmax(keepdim=True),
    "argmin(x, dim=None, keepdim=True)": lambda x: torch.argmin(x, dim=None, keepdim=True),
    "sum(dim=None)": lambda x: torch.sum(x, dim=None) + x.amax(dim=None),
    "view(dtype=int64)": lambda x: x.view(dtype=torch.int64) % 7,
    "view(float32)": lambda x: x.view(torch.float32).nan_to_num(0.0, 0.0, 0.0).abs().sum(-1),
}


@pytest.mark.parametrize("case", sorted(KEYWORD_FORMS))
@pytest.mark.parametrize("lengths", [(3, 3, 3), (3, 1, 4)])
def test_reductions_over_everything_and_views_as_another_dtype(
    case: str, lengths: tuple[int, ...]
) -> None:
    """``argmax(keepdim=True)`` with no dim went to vmap, which gave the wrong rank; a view
    as another dtype was reshaped to the new shape in the old dtype."""
    make = KEYWORD_FORMS[case]
    gen = torch.Generator().manual_seed(len(case))
    xs = [torch.randn(n, 4, dtype=torch.float64, generator=gen) for n in lengths]

    def fn(x: Any) -> Any:
        return make(torch.as_tensor(x))

    for got, x in zip(bf.batch_map(fn, xs), xs, strict=True):
        torch.testing.assert_close(got, fn(x))


REFUSED: dict[str, Callable[[Any], Any]] = {
    "repeat_interleave(repeats=t)": lambda x: x.repeat_interleave(repeats=x.long(), dim=0),
    "repeat_interleave(counts)": lambda x: torch.repeat_interleave(x.long()),
    "where(condition=c)": lambda x: torch.where(condition=x > 1),
    "tensor_split(t)": lambda x: x.tensor_split(torch.tensor([1, 2]), dim=0)[0],
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_value_shaped_calls_by_keyword_are_refused_as_by_position(case: str) -> None:
    """The refusal read ``repeats`` and the split points by position only: by keyword these
    failed inside a batching rule ("a bug in batchfold's rule")."""
    make = REFUSED[case]
    for x in XS:
        make(x)  # eager runs

    with pytest.raises(bf.UnsupportedOpError, match="depends on per-instance values"):
        bf.batch_map(lambda x: make(torch.as_tensor(x)), XS)
