"""A Python number that differs per instance (``prediction - target``) batches, as eager computes.

Values, dtypes and gradients equal the same code run one instance at a time.
"""

from __future__ import annotations

import pytest
import torch

import batchfold as bf
from batchfold.schedule import Scheduler

TARGETS = [0.37, -1.5, 2.0, 0.37, 1e-8, 3, -7, 0.1]


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_per_instance_number_is_batched_with_eagers_values(
    dtype: torch.dtype, scheduler: Scheduler
) -> None:
    w = torch.linspace(-1, 1, 4, dtype=dtype, requires_grad=True)

    def loss(item: tuple[torch.Tensor, float]) -> torch.Tensor:
        x, target = item
        prediction = (w * torch.as_tensor(x)).sum()  # 0-d
        return (prediction - target) ** 2 + (target * prediction) / 3 + (1 - prediction / target)

    items = [(torch.randn(4, dtype=dtype), t) for t in TARGETS]
    got, stats = bf.batch_map(loss, items, scheduler=scheduler, return_stats=True)
    want = [loss(item) for item in items]
    for g, e in zip(got, want, strict=True):
        assert g.dtype == e.dtype == dtype
        torch.testing.assert_close(g, e)
    (grad,) = torch.autograd.grad(torch.stack(got).sum(), w)
    (expected,) = torch.autograd.grad(torch.stack(want).sum(), w)
    torch.testing.assert_close(grad, expected)
    assert stats.plan is not None
    subs = [s for s in stats.plan.steps if s.sig.name == "sub"]
    assert sum(len(s.nodes) for s in subs) == len(TARGETS) and len(subs) <= 3


@pytest.mark.parametrize("dtype", [torch.float16, torch.int64, torch.int32])
def test_numbers_with_other_dtypes_stay_constants_of_their_op(dtype: torch.dtype) -> None:
    # eager computes float16 with the number in float32, and int tensors take a float number
    # to the default dtype: a 0-d tensor of either dtype would differ, so nothing changes
    def fn(item: tuple[torch.Tensor, float]) -> torch.Tensor:
        return torch.as_tensor(item[0]) * item[1] - item[1]

    items = [(torch.arange(1, 200).to(dtype), t) for t in TARGETS]
    got = bf.batch_map(fn, items)
    for g, item in zip(got, items, strict=True):
        e = fn(item)
        assert g.dtype == e.dtype
        assert torch.equal(g, e)  # float16 with the number rounded to float16 differs here
