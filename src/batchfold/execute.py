"""The executor: a :class:`~batchfold.schedule.Plan` -> tensors, one batched call per step.

Each step gathers its inputs from the outputs of any earlier step (a view when the rows are
one contiguous slice of one output), calls its op's batching rule once, and keeps the
outputs as one tensor per op output. Autograd runs through it all, so gradients reach every
parameter. :class:`Store` keeps the outputs of every segment run so far.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import torch

from .errors import ShapeError
from .graph import OUT_BITS, OUT_MASK, Signature
from .ops import LOOP, VMAP
from .schedule import Gather, Plan, Step

Tensor = torch.Tensor


class Store:
    """Every step output computed so far, and where each value lives in them."""

    def __init__(self) -> None:
        self.outputs: list[tuple[Tensor, ...] | None] = []
        self.node_step = np.zeros(0, dtype=np.int64)
        self.node_row = np.zeros(0, dtype=np.int64)
        self.fallbacks: Counter[str] = Counter()
        self.chunks: dict[tuple[int, int], tuple[Tensor, ...]] = {}  # (step, output) -> fanout

    @property
    def locations(self) -> tuple[np.ndarray, np.ndarray]:
        """``(node_step, node_row)`` of every node run so far."""
        return self.node_step, self.node_row

    def value(self, v: int) -> Tensor:
        """The tensor of computed value ``v`` (a view into its step's output)."""
        node = v >> OUT_BITS
        outputs = self.outputs[int(self.node_step[node])]
        assert outputs is not None, f"value {v} was freed"
        return outputs[v & OUT_MASK][int(self.node_row[node])]

    def values(self, vids: list[int]) -> list[Tensor]:
        """The tensors of many computed values: one gather per step output, then unbound."""
        ids = np.asarray(vids, dtype=np.int64)
        nodes = ids >> OUT_BITS
        source = self.node_step[nodes] * (OUT_MASK + 1) + (ids & OUT_MASK)
        rows = self.node_row[nodes]
        result: list[Tensor | None] = [None] * len(vids)
        order = np.argsort(source, kind="stable")
        cuts = np.flatnonzero(np.diff(source[order])) + 1
        for group in np.split(order, cuts):
            outputs = self.outputs[int(self.node_step[nodes[group[0]]])]
            assert outputs is not None
            tensor = outputs[int(ids[group[0]] & OUT_MASK)]
            index = torch.from_numpy(rows[group]).to(tensor.device)
            for position, value in zip(group, tensor.index_select(0, index).unbind(0), strict=True):
                result[position] = value
        return result  # type: ignore[return-value]

    def run(self, plan: Plan) -> None:
        """Run every step of ``plan`` and record where the segment's nodes landed."""
        for step in plan.steps:
            outs = self._run_step(step)
            self.outputs.append(outs)
            for fanout in step.fanouts:
                out = outs[fanout.output]
                if fanout.rows is not None:
                    out = out.index_select(0, torch.from_numpy(fanout.rows).to(out.device))
                self.chunks[step.index, fanout.output] = out.split(fanout.sizes)
        self.node_step = np.concatenate([self.node_step, plan.node_step])
        self.node_row = np.concatenate([self.node_row, plan.node_row])

    def _run_step(self, step: Step) -> tuple[Tensor, ...]:
        sig, n = step.sig, len(step.nodes)
        if not sig.in_metas:
            return (_sources(sig, [sig.payloads[p] for p in step.positions]),)
        inputs = [self._gather(g) for g in step.gathers]
        rule = sig.rule
        try:
            out = rule.batched(sig, inputs, n)
        except Exception as error:
            if rule is not VMAP:
                raise ShapeError(
                    f"{sig.name} recorded at {sig.site} failed when run over {n} instances: "
                    f"{type(error).__name__}: {error}"
                ) from error
            sig.rule = LOOP  # vmap cannot batch this op; run it once per instance from now on
            out = LOOP.batched(sig, inputs, n)
        if rule is VMAP or sig.rule is LOOP:
            self.fallbacks[f"{sig.name} ({sig.rule.name})"] += n
        outs = tuple(out) if sig.multi else (out,)
        for tensor, meta in zip(outs, sig.out_metas, strict=True):
            if tensor.shape[1:] != meta.shape or tensor.shape[0] != n:
                raise ShapeError(
                    f"batching rule {sig.rule.name} of {sig.name} (recorded at {sig.site}) "
                    f"returned {tuple(tensor.shape)}, expected {(n, *meta.shape)}"
                )
        return outs

    def _gather(self, gather: Gather) -> Tensor:
        pieces = []
        for part in gather.parts:
            outputs = self.outputs[part[0]]
            assert outputs is not None
            source = outputs[part[1]]
            if len(part) == 4:
                pieces.append(source[part[2] : part[3]])
            elif type(part[2]) is int:
                pieces.append(self.chunks[part[0], part[1]][part[2]])
            else:
                rows = torch.from_numpy(part[2]).to(source.device, non_blocking=True)
                pieces.append(source.index_select(0, rows))
        x = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
        if gather.order is not None:
            x = x.index_select(0, torch.from_numpy(gather.order).to(x.device, non_blocking=True))
        return x


def _sources(sig: Signature, payloads: list[Any]) -> Tensor:
    """Stack the per-instance constants of a source step into one tensor."""
    meta = sig.out_metas[0]
    if sig.template[0] == ("scalar",):
        return torch.tensor(payloads, dtype=meta.dtype, device=meta.device)
    return torch.stack(payloads)
