"""Profile one sample batch of a run: the plan, batch sizes, phases and the profiler's table.

At the end of ``batchfold train`` the loop runs the first training batch (at most
:data:`MAX_ITEMS` items) through ``task.loss`` and its backward pass once more with
profiling on, and writes what it saw to ``profile.json`` for the HTML report
(:mod:`batchfold.training.report`).

Tasks call ``bf.batch_map`` or a compiled blocks model without a ``profile`` flag, so
:func:`capture` turns profiling on around the call from outside: while it is active,
``batchfold.batch_map`` and :meth:`CompiledModel.run` run with ``profile=True`` and keep
their :class:`~batchfold.stats.Stats`, and every :meth:`Profile.step` is noted in order, which
gives each step's op, batch size and forward time. Everything is restored on exit.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

import batchfold
from batchfold.blocks.compiler import CompiledModel
from batchfold.profile import Profile
from batchfold.stats import Stats

__all__ = ["MAX_ITEMS", "Capture", "capture", "profile_batch"]

MAX_ITEMS = 64
"""The most items of the sample batch."""


class Capture:
    """What :func:`capture` saw: the stats of each batched call and each step in order."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, Stats]] = []  # (front end, stats) per outermost call
        self.steps: list[dict[str, Any]] = []  # op, batch, forward_ms, fallback


@contextlib.contextmanager
def capture() -> Iterator[Capture]:
    """Profile every ``batch_map`` and blocks call made inside the ``with`` block."""
    seen = Capture()
    depth = [0]
    original_map = batchfold.batch_map
    original_run = CompiledModel.run
    original_step = Profile.step

    def batch_map(fn: Any, instances: Any, **options: Any) -> Any:
        if depth[0]:  # nested: joins the outer batch, which is the one profiled
            return original_map(fn, instances, **options)
        wanted = options.pop("return_stats", False)
        options["profile"] = True
        depth[0] += 1
        try:
            outputs, stats = original_map(fn, instances, return_stats=True, **options)
        finally:
            depth[0] -= 1
        seen.runs.append(("batch_map", stats))
        return (outputs, stats) if wanted else outputs

    def run(self: CompiledModel, plan: Any, profile: bool = False) -> Any:
        result = original_run(self, plan, profile=True)
        if self.last_stats is not None:
            seen.runs.append(("blocks", self.last_stats))
        return result

    def step(
        self: Profile,
        sig: Any,
        n: int,
        gathered: int,
        outs: Any,
        seconds: float,
        ragged: bool = False,
    ) -> Any:
        entry = original_step(self, sig, n, gathered, outs, seconds, ragged)
        rule = "" if ragged else getattr(sig.rule, "name", "")
        fallback = rule if rule in ("vmap", "loop") else ""
        op = f"{sig.name} (ragged)" if ragged else sig.name
        seen.steps.append({"op": op, "batch": n, "forward_ms": seconds * 1e3, "fallback": fallback})
        return entry

    batchfold.batch_map = batch_map  # type: ignore[assignment]
    CompiledModel.run = run  # type: ignore[method-assign]
    Profile.step = step  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        batchfold.batch_map = original_map
        CompiledModel.run = original_run  # type: ignore[method-assign]
        Profile.step = original_step  # type: ignore[method-assign]


def _merge_rows(profiles: list[Profile]) -> list[dict[str, Any]]:
    """The rows of several profiles, one per signature and site, most expensive first."""
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for profile in profiles:
        for row in profile.rows():
            key = (row["signature"], row["site"])
            if key not in merged:
                merged[key] = dict(row)
                continue
            into = merged[key]
            for name in ("steps", "nodes", "rows_gathered", "output_mb", "forward_ms"):
                into[name] += row[name]
            into["backward_ms"] += row["backward_ms"]
            into["max_batch"] = max(into["max_batch"], row["max_batch"])
            into["mean_batch"] = into["nodes"] / into["steps"] if into["steps"] else 0.0
            into["fallback"] = into["fallback"] or row["fallback"]
    return sorted(merged.values(), key=lambda r: -(r["forward_ms"] + r["backward_ms"]))


def profile_batch(task: Any, model: nn.Module, batch: Sequence[Any]) -> dict[str, Any]:
    """Run ``task.loss`` and its backward on ``batch`` with profiling on; no weights change.

    The RNG state is restored after and the gradients are cleared, as in
    :func:`~batchfold.training.loop.compare_throughput`.

    Arguments:
        task: the training task.
        model: its model, in train mode.
        batch: the sample items (at most :data:`MAX_ITEMS` are used).

    Returns:
        The contents of ``profile.json``: ``items``, ``front_end``, ``seconds``,
        ``steps`` (in the order they ran), ``profile`` (the profiler's rows), ``phases``
        (seconds), ``fallbacks`` (nodes per op), ``nodes`` and ``table`` (the text table).
    """
    batch = list(batch[:MAX_ITEMS])
    model.train()
    model.zero_grad(set_to_none=True)
    with torch.random.fork_rng(devices=[]), capture() as seen:
        start = time.perf_counter()
        loss, _ = task.loss(model, batch)
        loss.backward()
        if loss.device.type == "cuda":
            torch.cuda.synchronize(loss.device)
        seconds = time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    profiles = [stats.profile for _, stats in seen.runs if stats.profile is not None]
    phases: dict[str, float] = {}
    fallbacks: dict[str, int] = {}
    for profile in profiles:
        for name, value in profile.phase_rows().items():
            phases[name] = phases.get(name, 0.0) + value
    for _, stats in seen.runs:
        for name, count in stats.fallbacks.items():
            fallbacks[name] = fallbacks.get(name, 0) + count
    return {
        "items": len(batch),
        "front_end": seen.runs[0][0] if seen.runs else None,
        "calls": len(seen.runs),
        "seconds": seconds,
        "nodes": sum(stats.nodes for _, stats in seen.runs),
        "steps": seen.steps,
        "profile": _merge_rows(profiles),
        "phases": phases,
        "fallbacks": fallbacks,
        "table": "\n\n".join(str(profile) for profile in profiles),
    }
