"""Each op below runs as one ragged step over sequences of several lengths, as eager computes.

Ops that keep each row to itself (along other dims), slices and ``cat`` along the rows, and
picks of a row: values and gradients in float64 equal one instance at a time, and the op's
step holds every length (``step.lengths`` set).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import batchfold as bf
from batchfold.schedule import Scheduler
from reference import assert_matches_eager

PARAMS = torch.nn.Module()
PARAMS.w = torch.nn.Parameter(torch.randn(4, 6, dtype=torch.float64))
W = PARAMS.w
Op = Callable[[torch.Tensor], torch.Tensor]

# name -> (the op's step name, the op on h [L, 6]); every op keeps L >= 1 rows apart
OPS: dict[str, tuple[str, Op]] = {
    "chunk along features": ("chunk", lambda h: h.chunk(3, -1)[1]),
    "split along features": ("split", lambda h: torch.split(h, [2, 4], dim=1)[1]),
    "stack after the rows": ("stack", lambda h: torch.stack([h, -h], -1)),
    "norm along features": ("norm", lambda h: h.norm(dim=-1)),
    "normalize": ("normalize", lambda h: F.normalize(h, dim=-1)),
    "variance": ("var", lambda h: h.var(-1)),
    "standard deviation": ("std", lambda h: h.std(1, keepdim=True)),
    "running sum along features": ("cumsum", lambda h: h.cumsum(-1)),
    "max along features": ("max", lambda h: h.max(-1).values),
    "argmax along features": ("argmax", lambda h: h * h.argmax(-1, keepdim=True)),
    "slice of the rows": ("getitem", lambda h: h[1:]),
    "slice from the end": ("getitem", lambda h: h[-2:]),
    "cat along the rows": ("cat", lambda h: torch.cat([h, h[:1]], 0)),
    "the last row": ("getitem", lambda h: h[-1]),
}


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
@pytest.mark.parametrize("name", sorted(OPS))
def test_the_op_is_one_ragged_step_with_eagers_values(name: str, scheduler: Scheduler) -> None:
    step_name, op = OPS[name]

    def fn(x: torch.Tensor) -> torch.Tensor:
        return op(torch.tanh(torch.as_tensor(x) @ W)) * 1.5

    gen = torch.Generator().manual_seed(len(name))
    xs = [torch.randn(n, 4, dtype=torch.float64, generator=gen) for n in (3, 1, 5, 2, 5, 4)]
    stats = assert_matches_eager(fn, xs, PARAMS, scheduler)
    assert stats.plan is not None
    steps = [s for s in stats.plan.steps if s.sig.name == step_name]
    assert len(steps) == 1 and steps[0].lengths is not None, stats.plan


@pytest.mark.parametrize(
    "op",
    [
        lambda h: h.chunk(2)[0],  # along the rows: dim 0 by default
        lambda h: h.var(),  # every element
        lambda h: h.norm(),
        lambda h: h.cumsum(0),
        lambda h: torch.stack([h, h]),  # a new dim before the rows
        lambda h: h[::2],
    ],
)
def test_the_same_ops_along_the_rows_batch_by_shape_with_eagers_values(op: Op) -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return op(torch.tanh(torch.as_tensor(x) @ W))

    xs = [torch.randn(n, 4, dtype=torch.float64) for n in (4, 2, 4, 6)]
    got = bf.batch_map(fn, xs)
    for g, x in zip(got, xs, strict=True):
        torch.testing.assert_close(g, fn(x))


@pytest.mark.parametrize(
    "op",
    [
        # NumPy's name for dim, which PyTorch takes (its type stubs do not say so)
        lambda h: torch.cat([h, h * 2], axis=1),  # pyright: ignore[reportCallIssue]
        lambda h: torch.concatenate([h, h], axis=-1),  # pyright: ignore[reportCallIssue]
        lambda h: torch.cat([h, h[:1]], axis=0),  # pyright: ignore[reportCallIssue]
        lambda h: h.sum(axis=-1),  # pyright: ignore[reportCallIssue]
        lambda h: torch.softmax(h, -1).sum(axis=0),  # pyright: ignore[reportCallIssue]
    ],
)
@pytest.mark.parametrize("lengths", [(3, 1, 5, 2), (3, 3, 3)])
def test_dims_named_axis_mean_what_they_mean_eagerly(op: Op, lengths: tuple[int, ...]) -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return op(torch.tanh(torch.as_tensor(x) @ W))

    xs = [torch.randn(n, 4, dtype=torch.float64) for n in lengths]
    for scheduler in ("agenda", "depth"):
        got = bf.batch_map(fn, xs, scheduler=scheduler)
        for g, x in zip(got, xs, strict=True):
            torch.testing.assert_close(g, fn(x))


def test_a_slice_outside_grad_mode_keeps_eagers_requires_grad() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(torch.as_tensor(x) @ W)
        with torch.no_grad():
            return h[1:]

    xs = [torch.randn(n, 4, dtype=torch.float64) for n in (3, 1, 5, 2, 5, 4)]
    got = bf.batch_map(fn, xs)
    want = [fn(x) for x in xs]
    assert [g.requires_grad for g in got] == [e.requires_grad for e in want]
    for g, e in zip(got, want, strict=True):
        torch.testing.assert_close(g, e)


HALF_OPS: dict[str, Op] = {
    "sum over the rows": lambda h: h.sum(0),
    "mean over the rows": lambda h: h.mean(0),
    "sum of everything": lambda h: h.sum(),
    "mean of everything": lambda h: h.mean(),
    "logsumexp over the rows": lambda h: torch.logsumexp(h, 0),
    "softmax over the rows": lambda h: torch.softmax(h, 0),
    "log_softmax over the rows": lambda h: torch.log_softmax(h, 0),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", list(HALF_OPS))
def test_half_precision_reductions_over_rows_round_as_eager(name: str, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    op = HALF_OPS[name]
    xs = [torch.randn(n, 8).to(dtype) for n in (1, 3, 7, 50, 333, 1000)]
    got = bf.batch_map(lambda x: op(torch.as_tensor(x) * 1), xs)
    for g, x in zip(got, xs, strict=True):
        assert torch.equal(g, op(x * 1)), name  # bit for bit: no tolerance
