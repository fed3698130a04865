"""The oracle: run per-instance code eagerly, one instance at a time, and compare with batch_map."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

import batchfold as bf
from batchfold.schedule import Scheduler


def flat_tensors(tree: Any) -> list[torch.Tensor]:
    """Every tensor in a nested result, in order."""
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, (list, tuple)):
        return [t for item in tree for t in flat_tensors(item)]
    if isinstance(tree, dict):
        return [t for key in sorted(tree) for t in flat_tensors(tree[key])]
    return []


def loss_of(results: Sequence[Any]) -> torch.Tensor:
    """A scalar that depends on every floating output, with a different weight on each."""
    total = torch.zeros((), dtype=torch.float64)
    for i, t in enumerate(t for r in results for t in flat_tensors(r)):
        if t.is_floating_point():
            total = total + (t.double() * (1.0 + 0.1 * (i % 7))).sin().sum()
    return total


def assert_matches_eager(
    fn: Callable[[Any], Any],
    instances: Sequence[Any],
    module: nn.Module | None = None,
    scheduler: Scheduler = "agenda",
    rtol: float = 1e-10,
) -> bf.Stats:
    """``batch_map(fn)`` equals ``[fn(x) for x in instances]``: values and parameter gradients."""
    params = list(module.parameters()) if module is not None else []
    eager = [fn(x) for x in instances]
    eager_grads = torch.autograd.grad(loss_of(eager), params, allow_unused=True) if params else []
    batched, stats = bf.batch_map(fn, instances, scheduler=scheduler, return_stats=True)
    got, want = flat_tensors(batched), flat_tensors(eager)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=rtol, atol=rtol)
    if params:
        grads = torch.autograd.grad(loss_of(batched), params, allow_unused=True)
        for g, w in zip(grads, eager_grads, strict=True):
            assert (g is None) == (w is None)
            if g is not None and w is not None:
                torch.testing.assert_close(g, w, rtol=rtol, atol=rtol)
    return stats
