"""Which pending nodes run together: TensorFlow Fold's depth rule and DyNet's agenda rule.

Both return the groups as one array of local node ids (``node - node_base``), group after
group, each group in increasing node order, and the ``bounds`` of the groups in it: group
``i`` is ``order[bounds[i]:bounds[i + 1]]``. Both take O(n log n) time for n nodes.

Beside them: which pending nodes a plan needs at all (:func:`needed_nodes`), and the helpers
the scheduler lays a plan out with (runs of equal keys in sorted arrays, :func:`fan_out`).
"""

from __future__ import annotations

import heapq

import numpy as np

from .graph import OUT_BITS, OUT_MASK
from .plan import Fanout, Part

SMALL_BATCH = 32  # batches up to this size update the agenda in Python, larger ones in NumPy
SMALL_GRAPH = 2048  # graphs up to this many nodes run the agenda on Python lists (faster there)
_INT16_MAX = int(np.iinfo(np.int16).max)


def by_depth(sig_of: np.ndarray, depth: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """Fold's rule: one group per (depth, signature), shallow first."""
    if len(sig_of) == 0:
        return np.zeros(0, dtype=np.int64), [0]
    key = depth * (sig_of.max() + 1) + sig_of
    # a stable sort on 16-bit keys is a radix sort: linear in the number of nodes
    small = key.max() < _INT16_MAX
    order = (key.astype(np.int16) if small else key).argsort(kind="stable")
    ordered = key[order]
    cuts = (ordered[1:] != ordered[:-1]).nonzero()[0] + 1
    return order, [0, *cuts.tolist(), len(order)]


def by_agenda(
    sig_of: np.ndarray,
    depth: np.ndarray,
    expensive: np.ndarray,
    consumers: np.ndarray,
    producers: np.ndarray,
) -> tuple[np.ndarray, list[int]]:
    """DyNet's rule: run the ready signature with the lowest mean depth; cheap ops win ties.

    Arguments:
        sig_of: each pending node's signature id.
        depth: each pending node's depth.
        expensive: 1 for every signature whose op is not cheap, else 0.
        consumers, producers: the pending edges, one ``(consumer, producer)`` pair per
            input read from a pending node (see :func:`pending_edges`).

    A signature's mean depth is taken over all its pending nodes, once, so its rank
    (mean depth, expensive, id) is fixed: a heap holds the ranks of the signatures that have
    ready nodes, and each signature keeps a list of its ready nodes. A step costs
    O(batch log batch + successors + log signatures).
    """
    n, n_sigs = len(sig_of), len(expensive)
    succ = consumers[np.argsort(producers, kind="stable")]  # successors, grouped by producer
    succ_ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(producers, minlength=n), out=succ_ptr[1:])
    waiting = np.bincount(consumers, minlength=n)  # unfinished inputs per node
    count = np.bincount(sig_of, minlength=n_sigs)
    mean_depth = np.bincount(sig_of, weights=depth, minlength=n_sigs) / np.maximum(count, 1)
    by_rank = np.lexsort((np.arange(n_sigs), expensive, mean_depth))
    rank = np.empty(n_sigs, dtype=np.int64)
    rank[by_rank] = np.arange(n_sigs)

    sig_at, rank_of = by_rank.tolist(), rank.tolist()
    if n <= SMALL_GRAPH:
        return _agenda_on_lists(sig_of, succ, succ_ptr, waiting, sig_at, rank_of)
    # a signature's ready nodes: node ids, and sorted arrays of them from the NumPy path
    ready: list[list[int | np.ndarray]] = [[] for _ in range(n_sigs)]
    ready_count = [0] * n_sigs
    heap: list[int] = []

    def add_ready(fresh: np.ndarray) -> None:
        """Add ``fresh`` (sorted node ids) to their signatures' ready nodes."""
        sigs = sig_of[fresh]
        order = np.argsort(sigs, kind="stable")
        cuts = np.flatnonzero(np.diff(sigs[order])) + 1
        for part in np.split(fresh[order], cuts) if len(fresh) else []:
            sig = int(sig_of[part[0]])
            if not ready_count[sig]:
                heapq.heappush(heap, rank_of[sig])
            ready[sig].append(part)
            ready_count[sig] += len(part)

    add_ready(np.flatnonzero(waiting == 0))
    chunks: list[np.ndarray] = []  # the groups, one after the other
    small: list[int] = []  # the groups since the last chunk
    bounds = [0]
    while heap:
        sig = sig_at[heapq.heappop(heap)]
        batch, ready[sig] = ready[sig], []
        size, ready_count[sig] = ready_count[sig], 0
        bounds.append(bounds[-1] + size)
        if size <= SMALL_BATCH:
            nodes: list[int] = []
            for item in batch:
                if isinstance(item, int):
                    nodes.append(item)
                else:
                    nodes.extend(item.tolist())
            nodes.sort()
            small.extend(nodes)
            for node in nodes:
                for s in succ[succ_ptr.item(node) : succ_ptr.item(node + 1)].tolist():
                    left = waiting.item(s) - 1
                    waiting[s] = left
                    if left == 0:
                        t = sig_of.item(s)
                        if not ready_count[t]:
                            heapq.heappush(heap, rank_of[t])
                        ready[t].append(s)
                        ready_count[t] += 1
            continue
        arrays = [item for item in batch if not isinstance(item, int)]
        ints = [item for item in batch if isinstance(item, int)]
        if len(arrays) == 1 and not ints:
            group = arrays[0]  # sorted already
        else:
            group = np.sort(np.concatenate([*arrays, np.array(ints, dtype=np.int64)]))
        if small:
            chunks.append(np.array(small, dtype=np.int64))
            small = []
        chunks.append(group)
        starts, stops = succ_ptr[group], succ_ptr[group + 1]
        lengths = stops - starts
        total = int(lengths.sum())
        if total == 0:
            continue
        hit = succ[np.repeat(starts - np.cumsum(lengths) + lengths, lengths) + np.arange(total)]
        np.subtract.at(waiting, hit, 1)
        add_ready(np.unique(hit[waiting[hit] == 0]))
    chunks.append(np.array(small, dtype=np.int64))
    order = np.concatenate(chunks)
    assert len(order) == n, "the agenda left nodes unscheduled: the graph has a cycle"
    return order, bounds


def _agenda_on_lists(
    sig_of: np.ndarray,
    succ: np.ndarray,
    succ_ptr: np.ndarray,
    waiting: np.ndarray,
    sig_at: list[int],
    rank_of: list[int],
) -> tuple[np.ndarray, list[int]]:
    """:func:`by_agenda`'s loop for a small graph (a decoding step's segment): the same
    groups, with the arrays as Python lists, where NumPy's cost per call would dominate."""
    sig_l, succ_l, ptr, wait = sig_of.tolist(), succ.tolist(), succ_ptr.tolist(), waiting.tolist()
    ready: list[list[int]] = [[] for _ in rank_of]  # a signature's ready nodes
    heap: list[int] = []  # the ranks of the signatures with ready nodes
    for node, inputs_left in enumerate(wait):
        if inputs_left == 0:
            if not ready[sig_l[node]]:
                heapq.heappush(heap, rank_of[sig_l[node]])
            ready[sig_l[node]].append(node)
    order: list[int] = []
    bounds = [0]
    while heap:
        sig = sig_at[heapq.heappop(heap)]
        nodes, ready[sig] = ready[sig], []
        nodes.sort()
        order.extend(nodes)
        bounds.append(len(order))
        for node in nodes:
            for s in succ_l[ptr[node] : ptr[node + 1]]:
                wait[s] -= 1
                if wait[s] == 0:
                    t = sig_l[s]
                    if not ready[t]:
                        heapq.heappush(heap, rank_of[t])
                    ready[t].append(s)
    assert len(order) == len(sig_l), "the agenda left nodes unscheduled: the graph has a cycle"
    return np.array(order, dtype=np.int64), bounds


def pending_edges(
    members: dict[int, np.ndarray],
    inputs: dict[int, np.ndarray],
    base: int,
) -> tuple[np.ndarray, np.ndarray]:
    """(consumer, producer) local node pairs for the inputs produced in this segment.

    ``members[sig]`` are the signature's pending nodes and ``inputs[sig]`` their input
    value ids, one row per node.
    """
    consumer_parts, value_parts = [], []
    for sig_id, table in inputs.items():  # two NumPy calls a signature, the rest for all
        if table.shape[1]:
            consumer_parts.append(np.repeat(members[sig_id], table.shape[1]))  # row-major
            value_parts.append(table.ravel())
    if not consumer_parts:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty
    producer = (np.concatenate(value_parts) >> OUT_BITS) - base
    keep = producer >= 0
    return np.concatenate(consumer_parts)[keep], producer[keep]


def needed_nodes(
    consumers: np.ndarray, producers: np.ndarray, n: int, roots: np.ndarray
) -> np.ndarray | None:
    """Which of ``n`` pending nodes are needed: the ``roots`` (a mask) and, transitively, the
    nodes whose outputs a needed node reads (``pending_edges``' pairs); ``None`` when all are.

    Nodes that no node reads and that are no root go in rounds, each round the nodes whose
    last reader went in the round before: as many rounds as the longest such chain.
    """
    uses = np.bincount(producers, minlength=n)
    gone = ((uses == 0) & ~roots).nonzero()[0]
    if not len(gone):
        return None
    by_consumer = consumers.argsort(kind="stable")
    read = producers[by_consumer]  # each node's inputs, node after node
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.bincount(consumers, minlength=n).cumsum(out=ptr[1:])
    keep = np.ones(n, dtype=bool)
    while len(gone):
        keep[gone] = False
        counts = ptr[gone + 1] - ptr[gone]
        total = int(counts.sum())
        if not total:
            break
        at = (ptr[gone] - counts.cumsum() + counts).repeat(counts) + np.arange(total)
        inputs = read[at]
        np.subtract.at(uses, inputs, 1)
        inputs = np.unique(inputs)
        gone = inputs[(uses[inputs] == 0) & ~roots[inputs] & keep[inputs]]
    return keep


# runs of equal keys in sorted arrays: the scheduler's layout helpers ------------------------


def sort_by_input_source_row(input_of: np.ndarray, src: np.ndarray, row: np.ndarray) -> np.ndarray:
    """The stable order of entries by (input, source, row): one key where it fits in int64."""
    if len(row) == 0:
        return np.zeros(0, dtype=np.int64)
    n_src, n_row = int(src.max()) + 1, int(row.max()) + 1
    if (int(input_of.max()) + 1) * n_src * n_row >= 1 << 63:
        return np.lexsort((row, src, input_of))
    return ((input_of * n_src + src) * n_row + row).argsort(kind="stable")


def runs(items: np.ndarray, keys: np.ndarray) -> list[np.ndarray]:
    """``items`` cut where the sorted ``keys`` change: one piece per run of equal keys."""
    cuts = [0, *((keys[1:] != keys[:-1]).nonzero()[0] + 1).tolist(), len(items)]
    return [items[a:b] for a, b in zip(cuts[:-1], cuts[1:], strict=True)]


def run_lengths(run_start: np.ndarray, total: int) -> np.ndarray:
    """The length of each run, given where the runs start among ``total`` entries."""
    return np.concatenate([run_start[1:], [total]])[: len(run_start)] - run_start


def broken_runs(rows: np.ndarray, run_of: np.ndarray, n_runs: int) -> np.ndarray:
    """Whether each run's ``rows`` (runs are consecutive entries) are not ``a, a+1, ...``."""
    bad = (rows[1:] - rows[:-1] != 1) & (run_of[1:] == run_of[:-1])
    return np.bincount(run_of[:-1][bad], minlength=n_runs) > 0


def fan_out(
    parts: list[Part], source: np.ndarray, first_step: int, sizes: np.ndarray
) -> dict[int, list[Fanout]]:
    """Read every step output that several parts of the plan read through one ``Fanout``.

    Returns the fanouts of each step (by position in the plan) and makes each reader's part
    ``(step, output, j)``, chunk ``j``. A packed output (of a ragged step) is fanned out by
    nodes as well; the executor turns its nodes into their rows.
    """
    mine = (source >= first_step << OUT_BITS).nonzero()[0]
    by_source = mine[source[mine].argsort(kind="stable")]
    keys = source[by_source]
    run_start = np.concatenate(([True], keys[1:] != keys[:-1])).nonzero()[0] if len(keys) else mine
    run_length = run_lengths(run_start, len(keys))
    shared = (run_length > 1).nonzero()[0]
    fanouts: dict[int, list[Fanout]] = {}
    for r in shared[by_source[run_start[shared]].argsort()].tolist():  # by first read
        a = int(run_start[r])
        reads = by_source[a : a + int(run_length[r])].tolist()
        key = int(keys[a])
        step, output = key >> OUT_BITS, key & OUT_MASK
        rows = [part_rows(parts[i]) for i in reads]
        every = np.concatenate(rows)
        n = int(sizes[step - first_step])
        in_order = len(every) == n and bool((every == np.arange(n)).all())
        fanout = Fanout(output, None if in_order else every, tuple(len(x) for x in rows))
        fanouts.setdefault(step - first_step, []).append(fanout)
        for j, i in enumerate(reads):
            parts[i] = (step, output, j)
    return fanouts


def part_rows(part: Part) -> np.ndarray:
    """The rows a slice or index part reads."""
    if len(part) == 4:
        return np.arange(part[2], part[3])
    assert isinstance(part[2], np.ndarray)
    return part[2]
