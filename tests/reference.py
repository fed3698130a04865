"""The oracle: run per-instance code eagerly, one instance at a time, and compare with batch_map.

While :func:`assert_matches_eager` runs ``batch_map``, every graph segment is linted
(:meth:`batchfold.graph.Graph.lint`) just before it is scheduled, so each test that uses the
oracle also checks the recorded graph's invariants.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
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


def assert_grads_match(got: Any, want: Any, params: Sequence[torch.Tensor], tol: float) -> None:
    """The parameter gradients of :func:`loss_of` two results agree (``None`` in both, or
    equal within ``tol``)."""
    got_grads = torch.autograd.grad(loss_of(got), list(params), allow_unused=True)
    want_grads = torch.autograd.grad(loss_of(want), list(params), allow_unused=True)
    for g, w in zip(got_grads, want_grads, strict=True):
        assert (g is None) == (w is None)
        if g is not None and w is not None:
            torch.testing.assert_close(g, w, rtol=tol, atol=tol)


@contextmanager
def linting_graphs() -> Iterator[list[int]]:
    """Lint every graph segment just before it is scheduled; yields the sizes of those linted.

    ``schedule`` reads a graph's pending segment through :meth:`Graph.pending_arrays`, so that
    method is wrapped while the context is active (the recorder keeps its graph to itself). A
    segment scheduled twice (its unused values rehearsed: ``Executor.rehearse``) counts once.
    """
    pending_arrays = bf.Graph.pending_arrays
    linted: list[int] = []
    seen: set[tuple[int, int]] = set()

    def lint_first(self: bf.Graph) -> tuple[np.ndarray, np.ndarray, dict[int, np.ndarray]]:
        self.lint()
        if (id(self), self.node_base) not in seen:
            seen.add((id(self), self.node_base))
            linted.append(self.pending)
        return pending_arrays(self)

    bf.Graph.pending_arrays = lint_first
    try:
        yield linted
    finally:
        bf.Graph.pending_arrays = pending_arrays


def assert_matches_eager(
    fn: Callable[[Any], Any],
    instances: Sequence[Any],
    module: nn.Module | None = None,
    scheduler: Scheduler = "agenda",
    rtol: float = 1e-10,
) -> bf.Stats:
    """``batch_map(fn)`` equals ``[fn(x) for x in instances]``: values, their ``requires_grad``
    and parameter gradients.

    Every graph segment ``batch_map`` schedules is linted first.
    """
    params = list(module.parameters()) if module is not None else []
    eager = [fn(x) for x in instances]
    eager_grads = torch.autograd.grad(loss_of(eager), params, allow_unused=True) if params else []
    with linting_graphs() as linted:
        batched, stats = bf.batch_map(fn, instances, scheduler=scheduler, return_stats=True)
    recorded = stats.nodes + stats.unused  # run, or left out as no result needs them
    assert sum(linted) == recorded, "every recorded node is linted before it is scheduled"
    got, want = flat_tensors(batched), flat_tensors(eager)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert g.requires_grad == w.requires_grad, "requires_grad differs from eager's"
        torch.testing.assert_close(g, w, rtol=rtol, atol=rtol)
    if params:
        grads = torch.autograd.grad(loss_of(batched), params, allow_unused=True)
        floor: list[torch.Tensor] | None = None
        for i, (p, g, w) in enumerate(zip(params, grads, eager_grads, strict=True)):
            # batched steps may reach a parameter that eagerly only a no_grad node reads:
            # its gradient is then zeros where eager's is None (the same update under SGD)
            g = torch.zeros_like(p) if g is None else g
            w = torch.zeros_like(p) if w is None else w
            try:
                torch.testing.assert_close(g, w, rtol=rtol, atol=rtol)
            except AssertionError:
                floor = rounding_floor(fn, instances, params) if floor is None else floor
                if (g - w).abs().max() > 10 * floor[i]:
                    raise
    return stats


def rounding_floor(
    fn: Callable[[Any], Any], instances: Sequence[Any], params: Sequence[torch.Tensor]
) -> list[torch.Tensor]:
    """How far eager's own parameter gradients move when every parameter moves by a few units
    in the last place: the closest two computations of an ill-conditioned program can agree
    (a random program that grows values to thousands and feeds them to ``loss_of``'s ``sin``
    turns rounding into gradient differences of 1e-9). Random state is left as it was."""
    state = torch.get_rng_state()
    noise = torch.Generator().manual_seed(0)
    saved = [p.detach().clone() for p in params]
    try:
        with torch.no_grad():
            for p in params:
                eps = torch.finfo(p.dtype).eps
                p.mul_(1 + 4 * eps * (2 * torch.rand(p.shape, generator=noise) - 1).to(p))
        eager = [fn(x) for x in instances]
        before = torch.autograd.grad(loss_of(eager), list(params), allow_unused=True)
        with torch.no_grad():
            for p, s in zip(params, saved, strict=True):
                p.copy_(s)
        torch.set_rng_state(state)  # the same draws as the run before, if fn draws any
        eager = [fn(x) for x in instances]
        after = torch.autograd.grad(loss_of(eager), list(params), allow_unused=True)
    finally:
        with torch.no_grad():
            for p, s in zip(params, saved, strict=True):
                p.copy_(s)
        torch.set_rng_state(state)
    return [
        torch.zeros(()) if a is None or b is None else (a - b).abs().max()
        for a, b in zip(before, after, strict=True)
    ]
