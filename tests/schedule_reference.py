"""The reference scheduler: batchfold's schedule as it was before it was made O(n log n).

Its agenda rescans every node of the chosen signature at each step (O(n^2) on a chain) and its
plan builder makes several NumPy calls per group; it is kept verbatim so that the tests can
check that the new schedulers give the very same plans.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from batchfold.graph import OUT_BITS, OUT_MASK, Graph
from batchfold.schedule import Fanout, Gather, Plan, Scheduler, Step


def reference_schedule(
    graph: Graph,
    scheduler: Scheduler = "agenda",
    first_step: int = 0,
    locations: tuple[np.ndarray, np.ndarray] | None = None,
) -> Plan:
    """The scheduler as it was before it was made O(n log n): one NumPy pass per step."""
    if scheduler not in ("agenda", "depth"):
        raise ValueError(f"scheduler must be 'agenda' or 'depth', got {scheduler!r}")
    sig_of, depth, members = graph.pending_arrays()
    positions = np.zeros(len(sig_of), dtype=np.int64)
    inputs = {}
    for sig_id, local in members.items():
        positions[local] = np.arange(len(local))
        sig_inputs = graph.pending_of[sig_id].inputs
        inputs[sig_id] = np.asarray(sig_inputs, dtype=np.int64).reshape(len(local), -1)
    if scheduler == "depth":
        groups = reference_depth(sig_of, depth)
    else:
        groups = reference_agenda(graph, sig_of, depth, members, inputs)
    return _build(graph, groups, sig_of, positions, inputs, first_step, locations)


def reference_depth(sig_of: np.ndarray, depth: np.ndarray) -> list[np.ndarray]:
    """Fold's rule: one group per (depth, signature), shallow first."""
    if len(sig_of) == 0:
        return []
    key = depth * (sig_of.max() + 1) + sig_of
    # a stable sort on 16-bit keys is a radix sort: linear in the number of nodes
    small = key.max() < np.iinfo(np.int16).max
    order = np.argsort(key.astype(np.int16) if small else key, kind="stable")
    cuts = np.flatnonzero(np.diff(key[order])) + 1
    return np.split(order, cuts)


def reference_agenda(
    graph: Graph,
    sig_of: np.ndarray,
    depth: np.ndarray,
    members: dict[int, np.ndarray],
    inputs: dict[int, np.ndarray],
) -> list[np.ndarray]:
    """DyNet's rule: run the ready signature with the lowest mean depth; cheap ops win ties."""
    n, base, n_sigs = len(sig_of), graph.node_base, len(graph.signatures)
    consumers, producers = _pending_edges(members, inputs, base)
    order = np.argsort(producers, kind="stable")
    succ = consumers[order]  # successors, grouped by producer
    succ_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(producers, minlength=n), out=succ_ptr[1:])
    waiting = np.bincount(consumers, minlength=n)  # unfinished inputs per node
    count = np.bincount(sig_of, minlength=n_sigs)
    mean_depth = np.bincount(sig_of, weights=depth, minlength=n_sigs) / np.maximum(count, 1)
    expensive = np.array([not sig.rule.cheap for sig in graph.signatures], dtype=np.int64)
    by_sig = np.argsort(sig_of, kind="stable")
    sig_ptr = np.zeros(n_sigs + 1, dtype=np.int64)
    np.cumsum(count, out=sig_ptr[1:])
    ready = waiting == 0
    ready_count = np.bincount(sig_of[ready], minlength=n_sigs)
    done = np.zeros(n, dtype=bool)
    groups = []
    while True:
        candidates = np.flatnonzero(ready_count)
        if len(candidates) == 0:
            break
        best = candidates[
            np.lexsort((candidates, expensive[candidates], mean_depth[candidates]))[0]
        ]
        of_best = by_sig[sig_ptr[best] : sig_ptr[best + 1]]
        batch = of_best[ready[of_best] & ~done[of_best]]
        groups.append(batch)
        done[batch] = True
        ready_count[best] -= len(batch)
        starts, stops = succ_ptr[batch], succ_ptr[batch + 1]
        lengths = stops - starts
        if lengths.sum() == 0:
            continue
        flat = np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(lengths.sum())
        hit = succ[flat]
        np.subtract.at(waiting, hit, 1)
        fresh = np.unique(hit[waiting[hit] == 0])
        ready[fresh] = True
        ready_count += np.bincount(sig_of[fresh], minlength=n_sigs)
    assert done.all(), "the agenda left nodes unscheduled: the graph has a cycle"
    return groups


def _pending_edges(
    members: dict[int, np.ndarray],
    inputs: dict[int, np.ndarray],
    base: int,
) -> tuple[np.ndarray, np.ndarray]:
    """(consumer, producer) local node pairs for inputs produced in this segment."""
    consumer_parts, producer_parts = [], []
    for sig_id, table in inputs.items():
        if table.shape[1] == 0:
            continue
        local = members[sig_id]
        producer = (table >> OUT_BITS) - base  # [k, width]
        keep = producer >= 0
        consumer_parts.append(np.broadcast_to(local[:, None], producer.shape)[keep])
        producer_parts.append(producer[keep])
    if not consumer_parts:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty
    return np.concatenate(consumer_parts), np.concatenate(producer_parts)


def _build(
    graph: Graph,
    groups: list[np.ndarray],
    sig_of: np.ndarray,
    positions: np.ndarray,
    inputs: dict[int, np.ndarray],
    first_step: int,
    locations: tuple[np.ndarray, np.ndarray] | None,
) -> Plan:
    """Order each group's rows, place every node, and work out each input's gather."""
    base, n = graph.node_base, len(positions)
    node_step = np.zeros(n, dtype=np.int64)
    node_row = np.zeros(n, dtype=np.int64)
    empty = np.zeros(0, dtype=np.int64)
    old_step, old_row = locations if locations is not None else (empty, empty)

    def locate(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        nodes = values >> OUT_BITS
        if nodes.min() >= base:
            return node_step[nodes - base], node_row[nodes - base]
        old = nodes < base
        step, row = np.empty_like(nodes), np.empty_like(nodes)
        step[old], row[old] = old_step[nodes[old]], old_row[nodes[old]]
        step[~old], row[~old] = node_step[nodes[~old] - base], node_row[nodes[~old] - base]
        return step, row

    steps = []
    for i, group in enumerate(groups):
        sig = graph.signatures[int(sig_of[group[0]])]
        table = inputs[sig.id][positions[group]]  # [k, width] value ids
        if table.shape[1]:  # rows in the order of their first input: more gathers are views
            src_step, src_row = locate(table[:, 0])
            order = np.lexsort((src_row, table[:, 0] & OUT_MASK, src_step))
            group, table = group[order], table[order]
        node_step[group] = first_step + i
        node_row[group] = np.arange(len(group))
        gathers = tuple(_gather(*locate(column), column & OUT_MASK) for column in table.T)
        steps.append(Step(first_step + i, sig, group + base, gathers))
    return Plan(_fan_out(steps, first_step), base, node_step, node_row)


def _fan_out(steps: list[Step], first_step: int) -> list[Step]:
    """Read every step output that several gathers of the plan read through one ``Fanout``."""
    readers: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
    for s, step in enumerate(steps):
        for g, gather in enumerate(step.gathers):
            for p, part in enumerate(gather.parts):
                if part[0] >= first_step:
                    readers.setdefault((part[0], part[1]), []).append((s, g, p))
    parts = [[list(gather.parts) for gather in step.gathers] for step in steps]
    fanouts: dict[int, list[Fanout]] = {}
    for (source, output), reads in readers.items():
        if len(reads) < 2:
            continue
        rows = [_rows(parts[s][g][p]) for s, g, p in reads]
        every = np.concatenate(rows)
        n = len(steps[source - first_step].nodes)
        in_order = len(every) == n and bool(np.all(every == np.arange(n)))
        fanout = Fanout(output, None if in_order else every, tuple(len(r) for r in rows))
        fanouts.setdefault(source - first_step, []).append(fanout)
        for j, (s, g, p) in enumerate(reads):
            parts[s][g][p] = (source, output, j)
    return [
        replace(
            step,
            gathers=tuple(
                Gather(tuple(new), gather.order)
                for new, gather in zip(parts[s], step.gathers, strict=True)
            ),
            fanouts=tuple(fanouts.get(s, ())),
        )
        for s, step in enumerate(steps)
    ]


def _rows(part: tuple[int, int, int, int] | tuple[int, int, np.ndarray | int]) -> np.ndarray:
    """The rows a slice or index part reads."""
    if len(part) == 4:
        return np.arange(part[2], part[3])
    assert isinstance(part[2], np.ndarray)
    return part[2]


def _gather(step: np.ndarray, row: np.ndarray, out: np.ndarray) -> Gather:
    """Describe how to collect rows ``row`` of outputs ``out`` of steps ``step``, in order."""
    source = step * (out.max() + 1) + out
    if source.min() == source.max():
        return Gather((_part(int(step[0]), int(out[0]), row),))
    order = np.lexsort((row, source))
    cuts = np.flatnonzero(np.diff(source[order])) + 1
    parts = tuple(
        _part(int(step[idx[0]]), int(out[idx[0]]), row[idx]) for idx in np.split(order, cuts)
    )
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    return Gather(parts, inverse)


def _part(
    step: int, out: int, rows: np.ndarray
) -> tuple[int, int, int, int] | tuple[int, int, np.ndarray]:
    start = int(rows[0])
    if rows[-1] - start == len(rows) - 1 and (len(rows) < 3 or np.all(np.diff(rows) == 1)):
        return (step, out, start, start + len(rows))
    return (step, out, rows)
