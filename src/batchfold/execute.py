"""The executor: a :class:`~batchfold.schedule.Plan` -> tensors, one batched call per step.

Each step gathers its inputs from the outputs of any earlier step (a view when the rows are
one contiguous slice of one output), calls its op's batching rule once, and keeps the
outputs as one tensor per op output. Autograd runs through it all, so gradients reach every
parameter. :class:`Executor` keeps the outputs of every segment run so far.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any, Literal, cast, overload

import numpy as np
import torch

from .fused_stack import fusable, fused_stack
from .graph import OUT_BITS, OUT_MASK, Graph
from .grouping import runs
from .ops_views import forget_rows
from .profile import Profile, StepClock, mark
from .ragged import expand_rows
from .schedule import UNBOUND, Fanout, Gather, Plan, Step, schedule
from .step_calls import Fallbacks, run_op, run_ragged, sources_batch

Tensor = torch.Tensor


class Executor:
    """Runs plans: every step output computed so far, and where each value lives in them."""

    def __init__(self) -> None:
        self.outputs: list[tuple[Tensor, ...]] = []
        self.node_step = np.zeros(0, dtype=np.int64)
        self.node_row = np.zeros(0, dtype=np.int64)
        self.fallbacks = Fallbacks()
        self.chunks: dict[tuple[int, int], tuple[Tensor, ...]] = {}  # (step, output) -> fanout
        self.packed: dict[tuple[int, int], np.ndarray] = {}  # (step, output) -> row offsets
        # packed outputs of [L, L, *rest] values, each node's L * L rows of [*rest] (see
        # _square_rows): a reader takes them as the L rows of [L, *rest] it expects
        self.square: set[tuple[int, int]] = set()
        # (step, output) of a packed fanout -> each chunk's row offsets
        self.chunk_offsets: dict[tuple[int, int], list[np.ndarray]] = {}
        self.profile: Profile | None = None  # set to time every step
        self._numbers: dict[tuple[int, int], list[Any]] = {}  # (step, output) -> its numbers

    @property
    def locations(self) -> tuple[np.ndarray, np.ndarray]:
        """``(node_step, node_row)`` of every node run so far."""
        return self.node_step, self.node_row

    def value(self, v: int) -> Tensor:
        """The tensor of computed value ``v`` (a view into its step's output)."""
        node = v >> OUT_BITS
        step, row = int(self.node_step[node]), int(self.node_row[node])
        if step < 0:
            raise _left_out(v)
        tensor = self.outputs[step][v & OUT_MASK]
        offsets = self.packed.get((step, v & OUT_MASK)) if self.packed else None
        if offsets is not None:
            value = tensor[int(offsets[row]) : int(offsets[row + 1])]
            return _square(value) if (step, v & OUT_MASK) in self.square else value
        return tensor[row]

    def number(self, v: int) -> Any:
        """``item()`` of computed 0-d value ``v``, its step output read into numbers once."""
        node = v >> OUT_BITS
        step, row = int(self.node_step[node]), int(self.node_row[node])
        if step < 0:
            raise _left_out(v)
        key = (step, v & OUT_MASK)
        numbers = self._numbers.get(key)
        if numbers is None:  # 0-d values: never rows of a packed (ragged) output
            numbers = self._numbers[key] = self.outputs[step][v & OUT_MASK].tolist()
        return numbers[row]

    def values(self, vids: list[int], fresh: bool = False) -> list[Tensor]:
        """The tensors of many computed values: one gather per step output, then unbound.

        With ``fresh``, each value that requires grad is a tensor of its own, not a view
        (``batch_map``'s results): autograd refuses writes into the views ``unbind`` makes,
        and a write into any view of a step output changes a tensor that autograd may have
        saved for the other rows' gradients."""
        result: list[Tensor | None] = [None] * len(vids)
        for group, tensor, offsets, rows, key in self._by_output(np.asarray(vids, dtype=np.int64)):
            copy = fresh and tensor.requires_grad
            if offsets is None:
                rows_in_order = self._in_order(tensor, rows)
                if copy:  # the _copy ops are typed as maybe None (their out= form)
                    pieces = cast(tuple[Tensor, ...], torch.unbind_copy(rows_in_order))
                else:
                    pieces = rows_in_order.unbind(0)
            else:
                starts, ends = offsets[rows], offsets[rows + 1]
                index = torch.from_numpy(expand_rows(starts, ends - starts)).to(tensor.device)
                sizes = (ends - starts).tolist()
                gathered = tensor.index_select(0, index)
                if copy:
                    pieces = cast(tuple[Tensor, ...], torch.split_with_sizes_copy(gathered, sizes))
                else:
                    pieces = gathered.split(sizes)
                if key in self.square:
                    pieces = tuple(map(_square, pieces))
            for position, value in zip(group.tolist(), pieces, strict=True):
                result[position] = value
        return result  # type: ignore[return-value]

    def rows(self, ids: np.ndarray) -> Tensor:
        """Values of one shape, none of them packed, stacked along dim 0 in the order given.

        One slice (rows in order) or gather per step output, then one permutation.
        """
        parts, order = [], []
        for group, tensor, offsets, rows, _ in self._by_output(ids):
            if offsets is not None:  # rows of different lengths: no one stacked tensor
                raise ValueError("Executor.rows reads values of one shape; these are packed")
            order.append(group)
            parts.append(self._in_order(tensor, rows))
        stacked = parts[0] if len(parts) == 1 else torch.cat(parts)
        placed = np.concatenate(order)
        if (placed[1:] - placed[:-1] == 1).all():
            return stacked
        inverse = np.empty_like(placed)
        inverse[placed] = np.arange(len(placed))
        return stacked.index_select(0, torch.from_numpy(inverse).to(stacked.device))

    @staticmethod
    def _in_order(tensor: Tensor, rows: np.ndarray) -> Tensor:
        """Rows of a step output in the order given: a slice when they are consecutive (no
        copy, and no scatter in the backward pass), else one gather."""
        if rows[-1] - rows[0] == len(rows) - 1 and (rows[1:] - rows[:-1] == 1).all():
            return tensor[int(rows[0]) : int(rows[-1]) + 1]
        return tensor.index_select(0, torch.from_numpy(rows).to(tensor.device))

    def _by_output(
        self, ids: np.ndarray
    ) -> Iterator[tuple[np.ndarray, Tensor, np.ndarray | None, np.ndarray, tuple[int, int]]]:
        """Value ids grouped by the step output holding them.

        Yields, per output: the positions in ``ids``, the output tensor, its packed row
        offsets (``None`` unless packed), each value's row, and ``(step, output)``.
        """
        nodes = ids >> OUT_BITS
        steps, rows = self.node_step[nodes], self.node_row[nodes]
        if len(steps) and steps.min() < 0:
            raise _left_out(int(ids[steps.argmin()]))
        source = steps * (OUT_MASK + 1) + (ids & OUT_MASK)
        order = source.argsort(kind="stable")
        for group in runs(order, source[order]):
            step, output = int(steps[group[0]]), int(ids[group[0]] & OUT_MASK)
            offsets = self.packed.get((step, output)) if self.packed else None
            yield group, self.outputs[step][output], offsets, rows[group], (step, output)

    def run(self, plan: Plan) -> None:
        """Run every step of ``plan`` and record where the segment's nodes landed."""
        try:
            self._run_steps(plan)
        finally:
            forget_rows()  # the packed indices of this plan's steps: not kept past it
        self.node_step = np.concatenate([self.node_step, plan.node_step])
        self.node_row = np.concatenate([self.node_row, plan.node_row])

    def rehearse(self, graph: Graph, scheduler: Any, plan: Plan) -> None:
        """Run the nodes ``plan`` (just run) left out as nothing needs them (see ``schedule``),
        on a copy of this store without gradients: for the errors eager code raises in them."""
        left_out = plan.node_step < 0
        plan = schedule(graph, scheduler, len(self.outputs), self.locations, only=left_out)
        scratch = Executor()
        scratch.outputs, scratch.square = list(self.outputs), set(self.square)
        scratch.node_step, scratch.node_row = self.node_step, self.node_row
        scratch.packed, scratch.chunks = dict(self.packed), dict(self.chunks)
        scratch.chunk_offsets = dict(self.chunk_offsets)
        with torch.no_grad():
            scratch.run(plan)

    def _run_steps(self, plan: Plan) -> None:
        for step in plan.steps:
            if step.sig.id == UNBOUND:
                raise ValueError(
                    f"step {step.index} ({step.sig.name}) comes from a pickled plan and is not "
                    "bound to an op; run the plan with the front end that made it, e.g. "
                    "CompiledModel.run"
                )
            outs = self._run_step(step)
            self.outputs.append(outs)
            if step.lengths is not None:
                offsets = np.concatenate([[0], np.cumsum(step.lengths)])
                for j, ragged in enumerate(step.sig.family.ragged_out):
                    if ragged:
                        self.packed[step.index, j] = offsets
                if step.sig.family.kind == "square":
                    self.square.add((step.index, 0))
            for fanout in step.fanouts:
                out, key = outs[fanout.output], (step.index, fanout.output)
                offsets = self.packed.get(key) if self.packed else None
                if offsets is not None:
                    self.chunks[key] = self._fan_out_packed(key, out, offsets, fanout)
                    continue
                if fanout.rows is not None:
                    out = out.index_select(0, torch.from_numpy(fanout.rows).to(out.device))
                self.chunks[key] = out.split(fanout.sizes)

    def _fan_out_packed(
        self, key: tuple[int, int], out: Tensor, offsets: np.ndarray, fanout: Fanout
    ) -> tuple[Tensor, ...]:
        """A packed output's chunks: each reader's nodes' rows, in one gather and one split."""
        nodes = np.arange(len(offsets) - 1) if fanout.rows is None else fanout.rows
        starts, lengths = offsets[nodes], offsets[nodes + 1] - offsets[nodes]
        if fanout.rows is not None:
            index = torch.from_numpy(expand_rows(starts, lengths)).to(out.device)
            out = out.index_select(0, index)
        per_chunk = np.split(lengths, np.cumsum(fanout.sizes)[:-1])
        self.chunk_offsets[key] = [np.concatenate([[0], np.cumsum(x)]) for x in per_chunk]
        return out.split([int(x.sum()) for x in per_chunk])

    def _run_step(self, step: Step) -> tuple[Tensor, ...]:
        if self.profile is not None:
            return self._profiled_step(step, self.profile)
        sig, n = step.sig, len(step.nodes)
        if not sig.in_metas:
            return (sources_batch(sig, step.payloads or [], step.lengths),)
        if step.lengths is not None:
            return run_ragged(sig, *self._ragged_inputs(step), step.lengths)
        if fusable(sig, len(step.gathers)) and not self._reads_any_packed(step):
            return (fused_stack(sig, step, n, self._pieces),)
        inputs = [self._gather(g, step, j) for j, g in enumerate(step.gathers)]
        return run_op(sig, inputs, n, self.fallbacks)

    def _ragged_inputs(self, step: Step) -> tuple[list[Tensor], dict[int, np.ndarray]]:
        """A ragged step's inputs, and each node's length in its secondary inputs."""
        secondary = step.sig.family.secondary
        inputs, sizes = [], {}
        for j, gather in enumerate(step.gathers):
            if j in secondary:
                row_shape = step.sig.in_metas[j].shape[1:]
                x, sizes[j] = self._gather_rows(gather, row_shape=row_shape, with_sizes=True)
                inputs.append(x)
            else:
                inputs.append(self._gather(gather, step, j))
        return inputs, sizes

    def _profiled_step(self, step: Step, profile: Profile) -> tuple[Tensor, ...]:
        sig, n = step.sig, len(step.nodes)
        with torch.profiler.record_function(f"bf:{sig.name} x{n}"):
            start = time.perf_counter()
            clock = StepClock()
            if not sig.in_metas:
                outs: tuple[Tensor, ...] = (sources_batch(sig, step.payloads or [], step.lengths),)
                gathered = 0
            else:
                sizes: dict[int, np.ndarray] = {}
                fused = fusable(sig, len(step.gathers)) and not self._reads_any_packed(step)
                if step.lengths is not None:
                    inputs, sizes = self._ragged_inputs(step)
                elif fused:  # its gathers are part of its op: timed with it
                    inputs = [fused_stack(sig, step, n, self._pieces)]
                else:
                    inputs = [self._gather(g, step, j) for j, g in enumerate(step.gathers)]
                gathered = n * len(step.gathers) if fused else sum(len(x) for x in inputs)
                inputs = mark(clock, inputs, start=False)
                if step.lengths is not None:
                    outs = run_ragged(sig, inputs, sizes, step.lengths)
                else:
                    outs = tuple(inputs) if fused else run_op(sig, inputs, n, self.fallbacks)
            outs = tuple(mark(clock, outs, start=True))
            clock.entry = profile.step(
                sig, n, gathered, outs, time.perf_counter() - start, step.lengths is not None
            )
        return outs

    def _gather(self, gather: Gather, step: Step, slot: int) -> Tensor:
        ragged = step.lengths is not None and step.sig.family.ragged_in[slot]
        if ragged or (self.packed and self._reads_packed(gather)):
            shape = step.sig.in_metas[slot].shape
            flat = ragged and slot == step.sig.family.square
            x = self._gather_rows(gather, flat, row_shape=shape[1:])
            return x if ragged else x.view(len(step.nodes), *shape)
        pieces = self._pieces(gather)
        x = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
        if gather.order is not None:
            x = x.index_select(0, torch.from_numpy(gather.order).to(x.device, non_blocking=True))
        return x

    def _pieces(self, gather: Gather) -> list[Tensor]:
        """The pieces of a gather that reads no packed output, before its ``order``."""
        pieces = []
        for part in gather.parts:
            outputs = self.outputs[part[0]]
            source = outputs[part[1]]
            if len(part) == 4:
                pieces.append(source[part[2] : part[3]])
            elif type(part[2]) is int:
                pieces.append(self.chunks[part[0], part[1]][part[2]])
            else:
                rows = torch.from_numpy(part[2]).to(source.device, non_blocking=True)
                pieces.append(source.index_select(0, rows))
        return pieces

    def _reads_packed(self, gather: Gather) -> bool:
        packed = self.packed
        return any((part[0], part[1]) in packed for part in gather.parts)

    def _reads_any_packed(self, step: Step) -> bool:
        return bool(self.packed) and any(self._reads_packed(g) for g in step.gathers)

    @overload
    def _gather_rows(
        self, gather: Gather, flat: bool = ..., *, row_shape: tuple[int, ...]
    ) -> Tensor: ...
    @overload
    def _gather_rows(
        self,
        gather: Gather,
        flat: bool = ...,
        *,
        row_shape: tuple[int, ...],
        with_sizes: Literal[True],
    ) -> tuple[Tensor, np.ndarray]: ...
    def _gather_rows(
        self,
        gather: Gather,
        flat: bool = False,
        *,
        row_shape: tuple[int, ...],
        with_sizes: bool = False,
    ) -> Tensor | tuple[Tensor, np.ndarray]:
        """A gather's values as rows of ``row_shape``: each node's value, leading dim first,
        concatenated.

        ``flat``: each value's elements instead of its rows (values of different shapes).
        """
        pieces, lengths = [], []
        for part in gather.parts:
            key = (part[0], part[1])
            if len(part) == 3 and type(part[2]) is int:  # a fanout chunk: its rows in order
                j = part[2]
                source = self.chunks[key][j]
                chunk_offsets = self.chunk_offsets.get(key)
                offsets = None if chunk_offsets is None else chunk_offsets[j]
                rows = np.arange(len(source) if offsets is None else len(offsets) - 1)
                in_order = True
            else:
                source = self.outputs[part[0]][part[1]]
                offsets = self.packed.get(key)
                rows = np.arange(part[2], part[3]) if len(part) == 4 else cast(np.ndarray, part[2])
                in_order = len(part) == 4  # consecutive rows: a view, no copy
            if offsets is None:  # one node per row of [n, L, *rest]
                width = math.prod(source.shape[1:]) if flat else source.shape[1]
                # sizes, not -1: a value may have no elements ([0, 0])
                if flat:
                    source = source.reshape(len(source) * width)
                else:
                    source = source.reshape(len(source) * width, *source.shape[2:])
                starts, size = rows * width, np.full(len(rows), width, dtype=np.int64)
            else:
                starts = offsets[rows]
                size = offsets[rows + 1] - starts
                if flat:  # the rows' elements (a fanout's chunk may have no rows)
                    width = math.prod(source.shape[1:])
                    source, starts, size = source.reshape(-1), starts * width, size * width
            if in_order and len(rows):
                piece = source[int(starts[0]) : int(starts[-1] + size[-1])]
            else:
                index = torch.from_numpy(expand_rows(starts, size)).to(source.device)
                piece = source.index_select(0, index)
            if not flat and key in self.square:
                piece, size = _square_rows(piece, size, row_shape)
            pieces.append(piece)
            lengths.append(size)
        x = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
        size = np.concatenate(lengths)
        if gather.order is not None:
            starts = np.cumsum(size) - size
            size = size[gather.order]
            index = expand_rows(starts[gather.order], size)
            x = x.index_select(0, torch.from_numpy(index).to(x.device))
        return (x, size) if with_sizes else x


def _square(value: Tensor) -> Tensor:
    """One node's ``[L * L, *rest]`` rows of a packed square output as its ``[L, L, *rest]``."""
    side = math.isqrt(len(value))
    return value.view(side, side, *value.shape[1:])


def _square_rows(
    piece: Tensor, size: np.ndarray, row_shape: tuple[int, ...]
) -> tuple[Tensor, np.ndarray]:
    """Nodes' ``L * L`` rows each of a packed square output (``[sum L * L, *rest]``) as the
    ``L`` rows of ``row_shape`` (``[L, *rest]``) each that their reader takes."""
    sides = np.rint(np.sqrt(size)).astype(np.int64)  # exact: every size is a square
    return piece.reshape(int(sides.sum()), *row_shape), sides


def _left_out(v: int) -> RuntimeError:
    return RuntimeError(f"value {v} was read, but its plan left it out (a bug: please report it)")
