"""Scheduling alone: nodes scheduled per second by each scheduler, from 10^3 to 10^6 nodes.

Graphs are built directly with :class:`batchfold.graph.Graph` (no recording), from random
trees, with the node structure ``batch_map`` records for them, so that only
``batchfold.schedule.schedule`` is timed:

* ``tree-lstm``: the Tree-LSTM classifier of ``bench_treelstm.py`` on random trees with 2-60
  leaves, cells recorded as one node each: per leaf a word (a source), its embedding and the
  leaf cell (two outputs); per internal node the cell (four inputs, two outputs); per node
  the output layer, a label (a source) and the cross-entropy.
* ``fold``: the cell of TensorFlow Fold's benchmark on random trees with 128 leaves: per leaf a
  word and its embedding; per internal node the cell.
* ``chain``: one instance of ``x = x * 0.999 + 0.001`` repeated: a source, then ``mul`` and
  ``add`` nodes in turn, each reading the one before. Every step is a single node, so the
  per-step cost of a scheduler is all there is (the worst case for both).

For each graph size the scheduler runs repeatedly (at least ``--repeats`` times and 0.2 s);
the median gives nodes per second. Growth is the exponent ``k`` of ``time ~ nodes^k`` between
one size and the next (1.0 is linear).

    python benchmarks/bench_schedule.py            # 10^3 .. 10^6 nodes
    python benchmarks/bench_schedule.py --quick    # the same sizes, fewer repeats
    python benchmarks/bench_schedule.py --workloads chain --sizes 100000 --repeats 1

Writes ``benchmarks/results/schedule[-quick].json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from batchfold.data.trees import BinaryTree, random_tree
from batchfold.graph import Graph, Signature, TensorMeta
from batchfold.ops import OpRule
from batchfold.schedule import Scheduler, schedule
from machine import describe_machine, markdown_table, spread

RESULTS = Path(__file__).resolve().parent / "results"
SCHEDULERS: tuple[Scheduler, ...] = ("agenda", "depth")
WORKLOADS = ("tree-lstm", "fold", "chain")
CPU = torch.device("cpu")


def _meta(*shape: int, dtype: torch.dtype = torch.float32) -> TensorMeta:
    return TensorMeta.of(tuple(shape), dtype, CPU)


def _never(sig: Signature, inputs: list[torch.Tensor], n: int) -> Any:
    raise AssertionError("scheduling benchmark graphs are never executed")


class GraphBuilder:
    """Adds the nodes of one workload's trees to a graph (see the module docstring).

    Arguments:
        workload: ``"tree-lstm"``, ``"fold"`` or ``"chain"``.
    """

    def __init__(self, workload: str) -> None:
        if workload not in WORKLOADS:
            raise ValueError(f"unknown workload {workload!r}; expected one of {WORKLOADS}")
        self.workload = workload
        self.graph = Graph()
        width = 150 if workload == "tree-lstm" else 256
        word, vec, state = _meta(dtype=torch.int64), _meta(300), _meta(width)
        self.word = self._sig("word", (), (word,), cheap=True)
        self.label = self._sig("label", (), (word,), cheap=True)
        self.embedding = self._sig("embedding", (word,), (vec if width == 150 else state,))
        self.leaf = self._sig("leaf", (vec,), (state, state))
        if workload == "tree-lstm":
            self.cell = self._sig("cell", (state,) * 4, (state, state))
        else:
            self.cell = self._sig("cell", (state, state), (state,))
        self.output = self._sig("linear", (state,), (_meta(5),))
        self.loss = self._sig("cross_entropy", (_meta(5), word), (_meta(),), cheap=False)
        scalar = _meta()
        self.start = self._sig("tensor", (), (scalar,), cheap=True)
        self.mul = self._sig("mul", (scalar,), (scalar,), cheap=True)
        self.add = self._sig("add", (scalar,), (scalar,), cheap=True)

    def _sig(
        self,
        name: str,
        ins: tuple[TensorMeta, ...],
        outs: tuple[TensorMeta, ...],
        cheap: bool = False,
    ) -> Signature:
        multi = tuple if len(outs) > 1 else None
        return self.graph.signature(
            name,
            func=_never,
            rule=OpRule(name, _never, cheap=cheap),
            name=name,
            in_metas=ins,
            out_metas=outs,
            multi=multi,
        )

    def add_chain(self, nodes: int, instance: int) -> None:
        """Add one chain of ``nodes`` nodes: a source, then ``mul`` and ``add`` in turn."""
        g = self.graph
        x = g.add(self.start, (), instance, payload=0.5)
        for i in range(nodes - 1):
            x = g.add(self.add if i % 2 else self.mul, (x,), instance)

    def add_tree(self, tree: BinaryTree, instance: int) -> None:
        """Add one tree's nodes, in post-order."""
        g = self.graph
        states: list[tuple[int, ...]] = []
        for n in tree.nodes():
            if n.left is None:
                word = g.add(self.word, (), instance, payload=n.word)
                vec = g.add(self.embedding, (word,), instance)
                if self.workload == "fold":
                    states.append((vec,))
                    continue
                h = g.add(self.leaf, (vec,), instance)
                states.append((h, h + 1))
            else:
                right, left = states.pop(), states.pop()
                first = g.add(self.cell, left + right, instance)
                states.append((first,) if self.workload == "fold" else (first, first + 1))
            if self.workload == "tree-lstm":
                logits = g.add(self.output, (states[-1][0],), instance)
                label = g.add(self.label, (), instance, payload=n.label)
                g.add(self.loss, (logits, label), instance)


def build_graph(workload: str, nodes: int, seed: int = 0) -> tuple[Graph, int]:
    """A graph of at least ``nodes`` nodes from random trees (or one chain of ``nodes``
    nodes); returns it and the tree (or chain) count."""
    rng = random.Random(seed)
    builder = GraphBuilder(workload)
    trees = 0
    if workload == "chain":
        builder.add_chain(nodes, 0)
        trees = 1
    while builder.graph.pending < nodes:
        n_leaves = rng.randint(2, 60) if workload == "tree-lstm" else 128
        builder.add_tree(random_tree(n_leaves, rng, 1000), trees)
        trees += 1
    if nodes <= 10_000:
        builder.graph.lint()
    return builder.graph, trees


def time_schedule(
    graph: Graph, scheduler: Scheduler, repeats: int, min_s: float
) -> tuple[list[float], int]:
    """Seconds of each ``schedule`` call after an untimed one (at least ``repeats`` calls and
    ``min_s`` seconds in all), and the plan's step count."""
    times: list[float] = []
    steps = len(schedule(graph, scheduler).steps)  # untimed: first-call costs
    while len(times) < repeats or sum(times) < min_s:
        start = time.perf_counter()
        plan = schedule(graph, scheduler)
        times.append(time.perf_counter() - start)
        assert plan.num_nodes == graph.pending and len(plan.steps) == steps
    return times, steps


def run(
    sizes: Sequence[int],
    repeats: int,
    min_s: float,
    threads: int,
    workloads: Sequence[str] = WORKLOADS,
) -> dict[str, Any]:
    """Measure every (workload, size, scheduler); returns the JSON-ready results."""
    torch.set_num_threads(threads)
    rows: list[dict[str, Any]] = []
    for workload in workloads:
        for size in sizes:
            start = time.perf_counter()
            graph, trees = build_graph(workload, size)
            build_s = time.perf_counter() - start
            for scheduler in SCHEDULERS:
                times, steps = time_schedule(graph, scheduler, repeats, min_s)
                median = statistics.median(times)
                row = {
                    "workload": workload,
                    "scheduler": scheduler,
                    "target_nodes": size,
                    "nodes": graph.pending,
                    "trees": trees,
                    "steps": steps,
                    "median_s": median,
                    "min_s": min(times),
                    "max_s": max(times),
                    "times_s": times,
                    "nodes_per_s": graph.pending / median,
                    "graph_build_s": build_s,
                }
                previous = [
                    r for r in rows if r["workload"] == workload and r["scheduler"] == scheduler
                ]
                if previous:
                    p = previous[-1]
                    row["growth"] = math.log(median / p["median_s"]) / math.log(
                        row["nodes"] / p["nodes"]
                    )
                rows.append(row)
                print(format_row(row), flush=True)
    return {"benchmark": "schedule", "machine": describe_machine(threads), "rows": rows}


def format_row(r: dict[str, Any]) -> str:
    """A progress line."""
    growth = f"  growth {r['growth']:.2f}" if "growth" in r else ""
    return (
        f"{r['workload']:>9s} {r['scheduler']:>6s} {r['nodes']:>9d} nodes {r['steps']:>6d} steps "
        f"{1e3 * r['median_s']:9.2f} ms  {r['nodes_per_s'] / 1e6:6.2f} M nodes/s{growth}"
    )


def summary(results: dict[str, Any]) -> str:
    """The markdown report."""
    m = results["machine"]
    table = [
        [
            r["workload"],
            r["scheduler"],
            r["nodes"],
            r["trees"],
            r["steps"],
            f"{1e3 * r['median_s']:.2f}",
            spread(r),
            f"{r['nodes_per_s'] / 1e6:.2f}",
            f"{r['growth']:.2f}" if "growth" in r else "",
        ]
        for r in results["rows"]
    ]
    head = ["graph", "scheduler", "nodes", "instances", "steps", "ms", "spread", "M nodes/s"]
    head.append("growth")
    return (
        f"# Scheduling alone\n\n{m['cpu']}, {m['cpus']} CPUs, {m['threads']} torch threads, "
        f"numpy {m['numpy']}, commit {m['commit']}, {m['date']}\n\n"
        "ms: median time of one `schedule` call; instances: trees (or chains) in the graph. "
        "Growth: the exponent k of time ~ nodes^k from the row above (1.0 is linear).\n\n"
        + markdown_table(head, table)
        + "\n"
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Run, print, and write JSON and markdown."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10**3, 10**4, 10**5, 10**6])
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per size (min)")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for JSON and markdown")
    parser.add_argument("--stem", default=None, help="results file name (default: schedule)")
    args = parser.parse_args(argv)
    repeats = args.repeats or (3 if args.quick else 7)
    min_s = 0.05 if args.quick else 0.2
    results = run(args.sizes, repeats, min_s, args.threads, args.workloads)
    results["quick"] = args.quick
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.stem or ("schedule-quick" if args.quick else "schedule")
    (args.out / f"{stem}.json").write_text(json.dumps(results, indent=1))
    (args.out / f"{stem}.md").write_text(summary(results))
    print(summary(results))


if __name__ == "__main__":
    main()
