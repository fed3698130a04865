"""The scheduler: the graph's pending nodes -> a :class:`Plan` of batched steps.

``schedule(graph, "depth")`` is TensorFlow Fold's rule (one step per signature per depth);
``schedule(graph, "agenda")`` is DyNet's (repeatedly run the ready signature whose pending
nodes have the lowest average depth, cheap elementwise ops first on ties); the groups come
from :mod:`batchfold.grouping`. Laying the plan out takes O(n log n) time for n nodes: each
group's row order is found group by group (in plain Python for small groups), every gather
of every step with NumPy calls over the whole plan. The plan also says, for every input of
every step, where its rows come from; ``execute`` runs it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

import numpy as np

from .graph import OUT_BITS, OUT_MASK, Graph
from .grouping import (
    broken_runs,
    by_agenda,
    by_depth,
    fan_out,
    needed_nodes,
    pending_edges,
    run_lengths,
    runs,
    sort_by_input_source_row,
)
from .plan import UNBOUND, Fanout, Gather, Part, Plan, Step

__all__ = [
    "UNBOUND",
    "Fanout",
    "Gather",
    "Plan",
    "Scheduler",
    "Step",
    "check_scheduler",
    "gc_paused",
    "schedule",
]

Scheduler = Literal["agenda", "depth"]


def schedule(
    graph: Graph,
    scheduler: Scheduler = "agenda",
    first_step: int = 0,
    locations: tuple[np.ndarray, np.ndarray] | None = None,
    needed: np.ndarray | None = None,
    only: np.ndarray | None = None,
) -> Plan:
    """Group the graph's pending nodes into batched steps.

    Arguments:
        graph: the graph whose pending nodes to schedule.
        scheduler: ``"agenda"`` (DyNet) or ``"depth"`` (TensorFlow Fold).
        first_step: the global index of this plan's first step (earlier segments' steps
            come before it).
        locations: ``(node_step, node_row)`` of every node run in earlier segments.
        needed: the value ids read once the plan has run, when no later segment will read
            others (the last one): nodes none of them needs are left out of the plan, as
            eager code never computes a value again once nothing refers to it (their
            ``node_step`` is -1). ``None``: every node runs.
        only: a mask of the pending nodes to run, the others having run in a plan before,
            whose places ``locations`` holds (see ``Executor.rehearse``).

    Returns:
        A :class:`Plan` whose steps, run in order, compute every pending node.

    Example:
        >>> import torch, batchfold as bf
        >>> lin = torch.nn.Linear(2, 2)
        >>> _, stats = bf.batch_map(lambda x: lin(torch.tensor(x)).tanh(), [[1.0, 2.0]] * 3,
        ...                         return_stats=True)
        >>> print(stats.plan)
        Plan: 9 nodes in 3 steps (mean batch 3.0)
        step    0  tensor                 x3
        step    1  linear                 x3      <- steps 0
        step    2  tanh                   x3      <- steps 1
    """
    check_scheduler(scheduler)
    sig_of, depth, members = graph.pending_arrays()
    positions = np.zeros(len(sig_of), dtype=np.int64)
    inputs = {}
    for sig_id, local in members.items():
        positions[local] = np.arange(len(local))
        sig_inputs = graph.pending_of[sig_id].inputs
        inputs[sig_id] = np.asarray(sig_inputs, dtype=np.int64).reshape(len(local), -1)
    # a ragged family's nodes share one buffer (sig_of), so they group as one signature's
    edges, keep = None, only
    if needed is not None and len(sig_of):
        edges = pending_edges(members, inputs, graph.node_base)
        roots = np.zeros(len(sig_of), dtype=bool)
        local = (needed >> OUT_BITS) - graph.node_base
        roots[local[local >= 0]] = True
        keep = needed_nodes(*edges, len(sig_of), roots)
    live = keep.nonzero()[0] if keep is not None else None
    if scheduler == "depth":
        if live is None:
            order, bounds = by_depth(sig_of, depth)
        else:
            order, bounds = by_depth(sig_of[live], depth[live])
            order = live[order]
    else:
        expensive = graph.signature_arrays()[1]
        consumers, producers = edges or pending_edges(members, inputs, graph.node_base)
        if live is None:
            order, bounds = by_agenda(sig_of, depth, expensive, consumers, producers)
        else:  # the needed nodes renumbered 0, 1, ...: the edges between them
            number = np.full(len(sig_of), -1, dtype=np.int64)
            number[live] = np.arange(len(live))
            among = (number[consumers] >= 0) & (number[producers] >= 0)
            order, bounds = by_agenda(
                sig_of[live],
                depth[live],
                expensive,
                number[consumers[among]],
                number[producers[among]],
            )
            order = live[order]
    own = graph.node_signatures(sig_of, members)
    layout = _Layout(graph, order, bounds, sig_of, own, first_step, locations)
    first = np.zeros(len(sig_of), dtype=np.int64)  # each node's first input value
    for sig_id, table in inputs.items():
        if table.shape[1]:
            first[members[sig_id]] = table[:, 0]
    layout.order_rows(first)
    with gc_paused():
        return layout.plan(positions, inputs)


def check_scheduler(scheduler: str) -> None:
    """Refuse a scheduler name other than ``"agenda"`` and ``"depth"``.

    Example:
        >>> check_scheduler("fifo")
        Traceback (most recent call last):
        ...
        ValueError: scheduler must be 'agenda' or 'depth', got 'fifo'
    """
    if scheduler not in ("agenda", "depth"):
        raise ValueError(f"scheduler must be 'agenda' or 'depth', got {scheduler!r}")


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while many small acyclic objects are made.

    Recording a batch and laying out its plan make millions of small objects, none in a
    cycle; the collections their allocation triggers took two thirds of the scheduling time
    on a one-million-node chain, and only cost time while recording.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class _Layout:
    """Where the nodes of a segment land: step ``node_step[i]``, row ``node_row[i]``.

    ``order`` holds the local node ids group after group (``bounds`` as from
    :mod:`batchfold.grouping`); :meth:`order_rows` puts each group's rows in their final
    order, then :meth:`plan` works out every gather for all steps at once.
    """

    def __init__(
        self,
        graph: Graph,
        order: np.ndarray,
        bounds: list[int],
        sig_of: np.ndarray,
        own: np.ndarray,
        first_step: int,
        locations: tuple[np.ndarray, np.ndarray] | None,
    ) -> None:
        empty = np.zeros(0, dtype=np.int64)
        self.graph, self.base, self.first_step = graph, graph.node_base, first_step
        self.order, self.bounds, self.sig_of, self.own = order, bounds, sig_of, own
        self.old_step, self.old_row = locations if locations is not None else (empty, empty)
        n = len(order)  # the nodes that run: all pending nodes, or the needed ones
        self.starts = np.asarray(bounds[:-1], dtype=np.int64)
        edges = np.asarray(bounds, dtype=np.int64)
        self.sizes = edges[1:] - edges[:-1]
        self.step_sig = own[order[self.starts]]  # in a family's mixed step, one member's
        widths = graph.signature_arrays()[0]
        self.width = widths[self.step_sig] if n else empty
        self.node_step = np.full(len(sig_of), -1, dtype=np.int64)  # -1: left out, never run
        self.node_row = np.full(len(sig_of), -1, dtype=np.int64)
        self.node_step[order] = first_step + np.arange(len(self.sizes)).repeat(self.sizes)
        self.node_row[order] = np.arange(n) - self.starts.repeat(self.sizes)

    def locate(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Steps and rows of global node ids ``nodes``, in this plan or run before it (in an
        earlier segment, or in the plan before one of some of this segment's nodes)."""
        local = nodes - self.base
        if len(local) == 0 or local.min() >= 0:
            step, row = self.node_step[local], self.node_row[local]
            if len(step) == 0 or step.min() >= 0:
                return step, row
        else:
            inside = np.maximum(local, 0)
            step = np.where(local >= 0, self.node_step[inside], -1)
            row = np.where(local >= 0, self.node_row[inside], -1)
        old = step < 0
        step[old], row[old] = self.old_step[nodes[old]], self.old_row[nodes[old]]
        return step, row

    def order_rows(self, first: np.ndarray) -> None:
        """Sort each group's rows by where their first input is (more gathers are views).

        Group by group, as a group's order depends on its inputs' rows; small groups in
        plain Python, with the sort key of the old per-group ``np.lexsort``.
        """
        order, bounds, row, step = self.order, self.bounds, self.node_row, self.node_step
        todo = (self.sizes > 1) & (self.width > 0)
        small = todo & (self.sizes <= SMALL_GROUP)
        # the small groups' nodes and first inputs, as Python ints
        lengths = self.sizes[small]
        at = (self.starts[small] - lengths.cumsum() + lengths).repeat(lengths)
        small_nodes = order[at + np.arange(len(at))]
        node_list, first_list = small_nodes.tolist(), first[small_nodes].tolist()
        base, old_step, old_row = self.base, self.old_step, self.old_row
        i = 0  # small groups seen so far: their nodes are node_list[:i]
        for s in todo.nonzero()[0].tolist():
            a, b = bounds[s], bounds[s + 1]
            if b - a > SMALL_GROUP:
                group = order[a:b]
                value = first[group]
                src_step, src_row = self.locate(value >> OUT_BITS)
                group = group[np.lexsort((src_row, value & OUT_MASK, src_step))]
                order[a:b] = group
                row[group] = np.arange(b - a)
                continue
            keys = []
            for j in range(i, i + b - a):
                value = first_list[j]
                node = value >> OUT_BITS
                if node >= base:
                    src = (step.item(node - base), value & OUT_MASK, row.item(node - base), j)
                else:
                    src = (old_step.item(node), value & OUT_MASK, old_row.item(node), j)
                keys.append(src)
            keys.sort()
            for r, key in enumerate(keys):
                if key[3] != i + r:
                    node = node_list[key[3]]
                    order[a + r] = node
                    row[node] = r
            i += b - a

    def plan(self, positions: np.ndarray, inputs: dict[int, np.ndarray]) -> Plan:
        """The plan, once :meth:`order_rows` has run."""
        order, bounds, first_step = self.order, self.bounds, self.first_step
        positions = positions[order]
        node_pool, node_sig = self.sig_of[order], self.own[order]
        lengths = self._lengths(node_sig)
        parts, source, part_ptr, orders = self._gathers(positions, inputs, node_pool)
        fanouts = fan_out(parts, source, first_step, self.sizes)
        gathers = [
            Gather(tuple(parts[a:b]), o)
            for a, b, o in zip(part_ptr[:-1], part_ptr[1:], orders, strict=True)
        ]
        input_ptr = [0, *self.width.cumsum().tolist()]
        nodes, sigs, pending = order + self.base, self.graph.signatures, self.graph.pending_of
        steps = [
            Step(
                first_step + s,
                sigs[sig],
                nodes[a:b],
                tuple(gathers[input_ptr[s] : input_ptr[s + 1]]),
                tuple(fanouts.get(s, ())),
                _payloads(pending[int(node_pool[a])].payloads, positions[a:b])
                if sigs[sig].source is not None
                else None,
                lengths.get(s),
            )
            for s, (sig, a, b) in enumerate(
                zip(self.step_sig.tolist(), bounds[:-1], bounds[1:], strict=True)
            )
        ]
        return Plan(steps, self.base, self.node_step, self.node_row)

    def _lengths(self, node_sig: np.ndarray) -> dict[int, np.ndarray]:
        """The ragged length of each node of every step whose nodes have several lengths."""
        if not self.graph.families:
            return {}
        changes = (node_sig[1:] != node_sig[:-1]).nonzero()[0] + 1
        if not len(changes):
            return {}
        step = np.searchsorted(self.starts, changes, side="right") - 1
        mixed = np.unique(step[changes != self.starts[step]])  # a change inside a step
        length_of = self.graph.signature_arrays()[2]
        return {
            s: length_of[node_sig[self.starts[s] : self.starts[s] + self.sizes[s]]]
            for s in mixed.tolist()
        }

    def _gathers(
        self, positions: np.ndarray, inputs: dict[int, np.ndarray], node_pool: np.ndarray
    ) -> tuple[list[Part], np.ndarray, list[int], list[np.ndarray | None]]:
        """Every step input's gather, for all steps at once.

        Returns the parts of all inputs in one list in plan order (step by step, input by
        input), each part's source ``step << OUT_BITS | output``, the bounds of each input's
        parts (input ``i`` has ``parts[ptr[i]:ptr[i + 1]]``) and each input's ``order``.
        An input that reads one step output is one part in row order; an input that reads
        several is sorted by (source, row) and cut into a part per source, as ``_gather``
        did for one input at a time.
        """
        sizes, width = self.sizes, self.width
        cells = sizes * width
        cell_start = cells.cumsum() - cells
        # input c of step s: entries cell_start[s] + c * sizes[s] + row, a value id per row
        values = np.empty(int(cells.sum()), dtype=np.int64)
        step_of = np.arange(len(sizes)).repeat(sizes)  # step of each row of the plan
        sig_of = node_pool
        by_sig = sig_of.argsort(kind="stable")
        for rows in runs(by_sig, sig_of[by_sig]):
            table = inputs[int(sig_of[rows[0]])] if len(rows) else None
            if table is None or table.shape[1] == 0:
                continue
            s = step_of[rows]
            entry = cell_start[s] + rows - self.starts[s]
            entries = entry[:, None] + np.arange(table.shape[1]) * sizes[s][:, None]
            values[entries] = table[positions[rows]]
        length = sizes.repeat(width)  # rows of each input
        start = length.cumsum() - length
        input_of = np.arange(len(length)).repeat(length)
        step, row = self.locate(values >> OUT_BITS)
        src = step << OUT_BITS | values & OUT_MASK
        mixed = np.bincount(input_of[src != src[start][input_of]], minlength=len(length)) > 0
        single = (~mixed).nonzero()[0]
        broken = broken_runs(row, input_of, len(length))[single]

        # inputs from several step outputs: sort their rows by (source, row), cut at sources
        entries = mixed[input_of].nonzero()[0]
        perm = entries[sort_by_input_source_row(input_of[entries], src[entries], row[entries])]
        sorted_input, sorted_src, sorted_row = input_of[perm], src[perm], row[perm]
        new = np.ones(len(perm), dtype=bool)
        new[1:] = (sorted_input[1:] != sorted_input[:-1]) | (sorted_src[1:] != sorted_src[:-1])
        cut = new.nonzero()[0]
        run_broken = broken_runs(sorted_row, new.cumsum() - 1, len(cut))
        mixed_length = length * mixed
        rank = np.empty(len(values), dtype=np.int64)
        rank[perm] = np.arange(len(perm)) - (mixed_length.cumsum() - mixed_length)[sorted_input]
        orders: list[np.ndarray | None] = [None] * len(length)
        for i, a, b in zip(
            mixed.nonzero()[0].tolist(),
            start[mixed].tolist(),
            (start + length)[mixed].tolist(),
            strict=True,
        ):
            orders[i] = rank[a:b]

        by_input = np.concatenate([single, sorted_input[cut]]).argsort(kind="stable")
        part_src = np.concatenate([src[start[single]], sorted_src[cut]])[by_input]
        first_row = np.concatenate([row[start[single]], sorted_row[cut]])[by_input]
        count = np.concatenate([length[single], run_lengths(cut, len(perm))])[by_input]
        index = np.concatenate([broken, run_broken])[by_input]
        offset = np.concatenate([start[single], len(values) + cut])[by_input]
        step_list, out_list = (part_src >> OUT_BITS).tolist(), (part_src & OUT_MASK).tolist()
        parts: list[Part] = list(
            zip(step_list, out_list, first_row.tolist(), (first_row + count).tolist(), strict=True)
        )
        index_parts = index.nonzero()[0].tolist()
        all_rows = np.concatenate([row, sorted_row]) if index_parts else row
        for i in index_parts:
            a = int(offset[i])
            parts[i] = (step_list[i], out_list[i], all_rows[a : a + int(count[i])])
        part_count = np.bincount(np.concatenate([single, sorted_input[cut]]), minlength=len(length))
        return parts, part_src, [0, *part_count.cumsum().tolist()], orders


SMALL_GROUP = 64  # groups up to this size get their row order in plain Python


def _payloads(payloads: list[Any], positions: np.ndarray) -> list[Any]:
    return [payloads[p] for p in positions.tolist()]
