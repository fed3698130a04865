"""Where a batched run spends its time and memory, signature by signature.

With ``batch_map(..., profile=True)`` (or ``model(inputs, profile=True)`` for blocks) the
executor times every step and marks its inputs and outputs so that the backward pass can be
timed per step too, and ``stats.profile`` holds a :class:`Profile`: per signature, the
steps, nodes and batch sizes, the rows gathered, the bytes of its outputs, the forward and
backward seconds and the fallbacks; per phase, record, schedule, execute and backward.
``print(stats.profile)`` shows a table sorted by time; :meth:`Profile.rows` gives plain data.
Each step also runs inside a ``torch.profiler.record_function`` range named after its
signature (``bf:linear x256``), so a ``torch.profiler`` trace, TensorBoard or Perfetto shows
batchfold's steps by name.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

Tensor = torch.Tensor


@dataclass
class SignatureProfile:
    """What one signature's steps cost, summed over the run."""

    name: str
    site: str
    steps: int = 0
    nodes: int = 0
    batch_sizes: list[int] = field(default_factory=list)
    rows_gathered: int = 0
    output_bytes: int = 0
    forward_s: float = 0.0
    backward_s: float = 0.0
    fallback: str = ""

    @property
    def total_s(self) -> float:
        """Forward plus backward seconds."""
        return self.forward_s + self.backward_s


@dataclass
class Profile:
    """Per-signature and per-phase costs of one batched run (see the module docstring)."""

    signatures: dict[int, SignatureProfile] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)

    def step(
        self,
        sig: Any,
        n: int,
        gathered: int,
        outs: tuple[Tensor, ...],
        seconds: float,
        ragged: bool = False,
    ) -> SignatureProfile:
        """Add one step of ``sig`` over ``n`` nodes; returns its entry (for backward times).

        A ``ragged`` step (nodes of several lengths, packed) counts under its family.
        """
        owner = sig.family if ragged else sig
        entry = self.signatures.get(id(owner))
        if entry is None:
            name = f"{sig.name} (ragged)" if ragged else sig.name
            entry = self.signatures[id(owner)] = SignatureProfile(name, sig.site)
        entry.steps += 1
        entry.nodes += n
        entry.batch_sizes.append(n)
        entry.rows_gathered += gathered
        entry.output_bytes += sum(t.numel() * t.element_size() for t in outs)
        entry.forward_s += seconds
        rule = "" if ragged else getattr(sig.rule, "name", "")
        if rule in ("vmap", "loop"):
            entry.fallback = rule
        return entry

    @property
    def backward_s(self) -> float:
        """Seconds of the backward pass spent inside batchfold's steps (0 before backward)."""
        return sum(e.backward_s for e in self.signatures.values())

    def rows(self) -> list[dict[str, Any]]:
        """One plain dict per signature, most expensive first."""
        entries = sorted(self.signatures.values(), key=lambda e: -e.total_s)
        return [
            {
                "signature": e.name,
                "site": e.site,
                "steps": e.steps,
                "nodes": e.nodes,
                "mean_batch": e.nodes / e.steps if e.steps else 0.0,
                "max_batch": max(e.batch_sizes, default=0),
                "rows_gathered": e.rows_gathered,
                "output_mb": e.output_bytes / 2**20,
                "forward_ms": e.forward_s * 1e3,
                "backward_ms": e.backward_s * 1e3,
                "fallback": e.fallback,
            }
            for e in entries
        ]

    def phase_rows(self) -> dict[str, float]:
        """Seconds per phase: record, schedule, execute and (once run) backward."""
        return {**self.phases, "backward": self.backward_s}

    def __str__(self) -> str:
        head = (
            f"{'signature':<24} {'steps':>5} {'nodes':>8} {'mean':>7} {'gathered':>9} "
            f"{'out MB':>7} {'fwd ms':>8} {'bwd ms':>8}  fallback"
        )
        lines = [head, "-" * len(head)]
        for r in self.rows():
            lines.append(
                f"{r['signature'][:24]:<24} {r['steps']:>5} {r['nodes']:>8} "
                f"{r['mean_batch']:>7.1f} {r['rows_gathered']:>9} {r['output_mb']:>7.2f} "
                f"{r['forward_ms']:>8.2f} {r['backward_ms']:>8.2f}  {r['fallback']}"
            )
        phases = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in self.phase_rows().items())
        lines.append(f"phases: {phases}")
        return "\n".join(lines)


class StepClock:
    """The backward clock of one step: started at its outputs, stopped at its inputs."""

    __slots__ = ("entry", "began")

    def __init__(self) -> None:
        self.entry: SignatureProfile | None = None
        self.began: float | None = None


class _Mark(torch.autograd.Function):
    """Identity whose backward notes the time: at a step's outputs (its backward starts) and
    at its inputs (its backward ends). Other work autograd runs in between is counted too."""

    @staticmethod
    def forward(ctx: Any, clock: StepClock, start: bool, *xs: Tensor) -> Any:  # type: ignore[override]
        ctx.clock, ctx.start = clock, start
        outs = [x.view_as(x) for x in xs]
        return tuple(outs) if len(outs) > 1 else outs[0]

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> Any:  # type: ignore[override]
        clock: StepClock = ctx.clock
        now = time.perf_counter()
        if ctx.start:
            clock.began = now
        elif clock.began is not None and clock.entry is not None:
            clock.entry.backward_s += now - clock.began
            clock.began = None
        return (None, None, *grads)


def mark(clock: StepClock, tensors: list[Tensor] | tuple[Tensor, ...], start: bool) -> list[Tensor]:
    """``tensors`` through a mark that starts (outputs) or stops (inputs) a step's clock."""
    if not torch.is_grad_enabled() or not any(t.requires_grad for t in tensors):
        return list(tensors)
    marked = _Mark.apply(clock, start, *tensors)
    return list(marked) if isinstance(marked, tuple) else [marked]
