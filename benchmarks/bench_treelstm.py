"""Binary Tree-LSTM: naive per-tree PyTorch, hand-written level batching, and batchfold.

All systems run in one process on the same model weights and the same trees: embedding 300,
hidden 150, a 5-class cross-entropy on every node, random binary trees with 2-60 leaves and
complete binary trees with 128 leaves, batch sizes 1, 32 and 256, inference and training
(forward, backward and an SGD step). batchfold runs ordinary per-tree code (the same code
the naive baseline runs, see ``tree_node_losses``) through ``batch_map``, with each scheduler,
with the cell recorded as one node (``bf.function``) and op by op ("per-op").

    python benchmarks/bench_treelstm.py            # full run, about 15 minutes on 2 cores
    python benchmarks/bench_treelstm.py --quick    # random trees, batch 32 and 256 only

Writes ``benchmarks/results/treelstm-<date>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch

import batchfold as bf
from baselines import Timing, make_batches, time_inference, time_training
from batchfold.data.trees import BinaryTree, complete_tree
from batchfold.models.tree_lstm import (
    TreeLSTMClassifier,
    level_batched_loss,
    naive_batch_loss,
    tree_node_losses,
)
from machine import describe_machine, markdown_table

RESULTS = Path(__file__).resolve().parent / "results"


class BatchfoldRunner:
    """A batch's loss through ``batch_map``; keeps the stats of the last call."""

    def __init__(self, model: TreeLSTMClassifier, scheduler: bf.schedule.Scheduler, fused: bool):
        self.model, self.scheduler = model, scheduler
        cell = model.cell
        self.leaf = bf.function(cell.leaf, batched=True) if fused else cell.leaf
        self.node = bf.function(cell, batched=True) if fused else cell
        self.stats: list[bf.Stats] = []

    def __call__(self, trees: Sequence[BinaryTree]) -> torch.Tensor:
        losses, stats = bf.batch_map(
            partial(tree_node_losses, self.model, leaf=self.leaf, node=self.node),
            trees,
            scheduler=self.scheduler,
            return_stats=True,
        )
        self.stats.append(stats)
        return torch.stack([loss for tree in losses for loss in tree]).sum()


def workload_batches(kind: str, batch_size: int, n_batches: int) -> list[list[BinaryTree]]:
    """Batches of the named workload."""
    if kind == "random 2-60 leaves":
        return make_batches(n_batches, batch_size, 2, 60, seed=batch_size)
    rng = random.Random(batch_size)
    return [
        [
            complete_tree(n_leaves=128, rng=rng, vocab_size=1000, n_classes=5)
            for _ in range(batch_size)
        ]
        for _ in range(n_batches)
    ]


def run(quick: bool, threads: int) -> dict[str, Any]:
    """Measure every configuration; returns the JSON-ready results."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = TreeLSTMClassifier(vocab_size=1000, emb_dim=300, hidden=150)
    systems: dict[str, Callable[[Sequence[BinaryTree]], torch.Tensor]] = {
        "naive per-tree": partial(naive_batch_loss, model),
        "hand-written level batching": partial(level_batched_loss, model),
        "batchfold agenda": BatchfoldRunner(model, "agenda", fused=True),
        "batchfold depth": BatchfoldRunner(model, "depth", fused=True),
        "batchfold agenda, per-op": BatchfoldRunner(model, "agenda", fused=False),
    }
    workloads = ["random 2-60 leaves"] if quick else ["random 2-60 leaves", "complete 128 leaves"]
    sizes = [32, 256] if quick else [1, 32, 256]
    rows = []
    for workload in workloads:
        for size in sizes:
            batches = workload_batches(workload, size, 3)
            for mode in ("inference", "training"):
                for name, runner in systems.items():
                    slow = (
                        name == "naive per-tree"
                        and size * (4 if "complete" in workload else 1) >= 256
                    )
                    repeats = 1 if slow else (2 if quick else 3)
                    timing = measure(runner, model, batches, mode, repeats, warmup=0 if slow else 1)
                    rows.append(row(workload, mode, size, name, timing, runner))
                    print(format_row(rows[-1]), flush=True)
    return {"benchmark": "tree-lstm", "machine": describe_machine(threads), "rows": rows}


def measure(
    runner: Any,
    model: torch.nn.Module,
    batches: list[list[BinaryTree]],
    mode: str,
    repeats: int,
    warmup: int,
) -> Timing:
    """Time one configuration."""
    if isinstance(runner, BatchfoldRunner):
        runner.stats.clear()
    if mode == "inference":
        return time_inference(runner, batches, warmup=warmup, repeats=repeats)
    sgd = torch.optim.SGD(model.parameters(), lr=1e-4)  # summed loss: larger rates diverge
    return time_training(runner, batches, sgd, warmup=warmup, repeats=repeats)


def row(
    workload: str, mode: str, size: int, name: str, timing: Timing, runner: Any
) -> dict[str, Any]:
    """One result row; batchfold rows carry their time split and batching statistics."""
    out: dict[str, Any] = {
        "workload": workload,
        "mode": mode,
        "batch_size": size,
        "system": name,
        "trees_per_s": timing.trees_per_s,
        "median_s": timing.median_s,
        "times_s": timing.times,
    }
    if isinstance(runner, BatchfoldRunner) and runner.stats:
        stats = runner.stats[-1]
        out.update(
            record_s=stats.record_s,
            schedule_s=stats.schedule_s,
            execute_s=stats.execute_s,
            nodes=stats.nodes,
            steps=stats.steps,
            mean_batch=stats.mean_batch,
            fallbacks=stats.fallbacks,
        )
    return out


def format_row(r: dict[str, Any]) -> str:
    """A progress line."""
    extra = ""
    if "record_s" in r:
        extra = (
            f"  record {r['record_s']:.3f}s schedule {r['schedule_s']:.3f}s "
            f"execute(forward) {r['execute_s']:.3f}s"
        )
    return (
        f"{r['workload']:>20s} {r['mode']:>9s} b={r['batch_size']:<4d} {r['system']:<28s} "
        f"{r['trees_per_s']:9.1f} trees/s{extra}"
    )


def summary(results: dict[str, Any]) -> str:
    """The markdown report: throughput and ratios per configuration."""
    rows = results["rows"]
    base = {(r["workload"], r["mode"], r["batch_size"], r["system"]): r for r in rows}
    table = []
    for r in rows:
        key = (r["workload"], r["mode"], r["batch_size"])
        naive = base[(*key, "naive per-tree")]["trees_per_s"]
        hand = base[(*key, "hand-written level batching")]["trees_per_s"]
        split = ""
        if "record_s" in r:
            total = r["median_s"]
            split = (
                f"{100 * r['record_s'] / total:.0f} / {100 * r['schedule_s'] / total:.0f} / "
                f"{100 * r['execute_s'] / total:.0f}"
            )
        table.append(
            [
                r["workload"],
                r["mode"],
                r["batch_size"],
                r["system"],
                f"{r['trees_per_s']:.1f}",
                f"{r['trees_per_s'] / naive:.1f}x",
                f"{r['trees_per_s'] / hand:.2f}x",
                split,
            ]
        )
    head = [
        "workload",
        "mode",
        "batch",
        "system",
        "trees/s",
        "vs naive",
        "vs hand-written",
        "record / schedule / execute-forward, % of step",
    ]
    m = results["machine"]
    return (
        f"# Tree-LSTM benchmark\n\n{m['cpu']}, {m['cpus']} CPUs, {m['threads']} threads, "
        f"torch {m['torch']}, commit {m['commit']}, {m['date']}\n\n"
        + markdown_table(head, table)
        + "\n"
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Run, print, and write JSON and markdown under benchmarks/results/."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="random trees, batch 32 and 256 only")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for JSON and markdown")
    args = parser.parse_args(argv)
    results = run(args.quick, args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "treelstm-quick" if args.quick else "treelstm"
    (args.out / f"{stem}.json").write_text(json.dumps(results, indent=1))
    (args.out / f"{stem}.md").write_text(summary(results))
    print(summary(results))


if __name__ == "__main__":
    main()
