"""Statistics of one ``batch_map`` run: how much was batched and where the time went."""

from __future__ import annotations

from dataclasses import dataclass, field

from .profile import Profile
from .schedule import Plan


@dataclass
class Stats:
    """What one run recorded, how it was batched, and the seconds spent in each phase.

    ``segments`` counts the plans run; ``syncs`` those run because instances waited on a
    value they read. ``fallbacks`` counts, per op, the nodes that ran through
    ``torch.func.vmap`` or one instance at a time because the op has no batching rule of its
    own. ``module_calls_cached`` counts ``nn.Module`` calls recorded as one node each,
    ``module_calls_traced`` those recorded op by op to make or check a trace, and
    ``module_misses`` the calls that could not be cached, by module and reason.
    ``ragged_steps`` counts the steps that ran nodes of several leading-dim lengths packed
    (:mod:`batchfold.ragged`). ``unused`` counts the nodes recorded for values that nothing
    returned or read needs, which the last plan leaves out, as eager code computes them and
    drops them (``nodes`` counts those that ran). ``profile`` is set when the run was
    profiled (``batch_map(..., profile=True)``).
    """

    instances: int = 0
    nodes: int = 0
    steps: int = 0
    segments: int = 0
    syncs: int = 0
    fallbacks: dict[str, int] = field(default_factory=dict)
    ragged_steps: int = 0
    unused: int = 0
    module_calls_cached: int = 0
    module_calls_traced: int = 0
    module_misses: dict[str, int] = field(default_factory=dict)
    record_s: float = 0.0
    schedule_s: float = 0.0
    execute_s: float = 0.0
    plan: Plan | None = None
    profile: Profile | None = None

    @property
    def mean_batch(self) -> float:
        """Mean number of nodes per batched step."""
        return self.nodes / self.steps if self.steps else 0.0

    @property
    def total_s(self) -> float:
        """Seconds spent recording, scheduling and executing."""
        return self.record_s + self.schedule_s + self.execute_s

    def __str__(self) -> str:
        lines = [
            f"{self.instances} instances, {self.nodes} nodes in {self.steps} steps "
            f"(mean batch {self.mean_batch:.1f}, {self.segments} segment(s), {self.syncs} sync(s))",
            f"time: record {self.record_s * 1e3:.1f} ms, schedule {self.schedule_s * 1e3:.1f} ms, "
            f"execute {self.execute_s * 1e3:.1f} ms",
        ]
        if self.unused:
            lines.append(f"{self.unused} nodes left out: values nothing returned needs")
        if self.module_calls_cached or self.module_calls_traced:
            lines.append(
                f"module calls: {self.module_calls_cached} as one node each (cached traces), "
                f"{self.module_calls_traced} traced op by op"
            )
        if self.module_misses:
            lines.append(
                "not cached: "
                + ", ".join(f"{why} x{count}" for why, count in sorted(self.module_misses.items()))
            )
        if self.fallbacks:
            lines.append(
                "no batching rule (vmap or per instance): "
                + ", ".join(f"{name} x{count}" for name, count in sorted(self.fallbacks.items()))
            )
        return "\n".join(lines)
