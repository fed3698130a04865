"""The per-instance front end on plainly written code: batch_map against a plain loop.

Two workloads, each written the way a user would write one instance of it, and run three
ways on the same weights and inputs: as a plain Python loop over instances (eager PyTorch),
and through ``batch_map`` with each scheduler, with cached module traces on (the default)
and off. Every system's loss is checked against the loop's before timing.

- **binary Tree-LSTM** (``tree_node_losses``: a lookup ``embed(torch.tensor(word))`` per leaf,
  the cell called per node, ``F.cross_entropy(output(h), torch.tensor(label))`` per node;
  embedding 300, hidden 150, random 2-60-leaf trees);
- **Child-Sum Tree-LSTM** (Tai et al.), 0-5 children per node, the cell an ``nn.Module``
  written for one node, a loss on every node (embedding 100, hidden 100, 20-60 nodes).

Training steps (forward, backward, SGD) at each batch size, median of repeats; the report
gives trees/s, the speedup over the loop, and batch_map's record / schedule / execute split.

    python benchmarks/bench_lazy.py            # batch 64 and 256, 2 threads
    python benchmarks/bench_lazy.py --quick    # batch 64, fewer repeats

Writes ``benchmarks/results/lazy[-quick].json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import batchfold as bf
from baselines import make_batches, synchronize
from batchfold.models.tree_lstm import TreeLSTMClassifier, tree_node_losses
from machine import describe_machine, markdown_table, write_results

RESULTS = Path(__file__).resolve().parent / "results"
Loss = Callable[[Sequence[Any]], tuple[torch.Tensor, "bf.Stats | None"]]


class ChildSumCell(nn.Module):
    """A Child-Sum Tree-LSTM cell (Tai et al. 2015) for one node and its children's states."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.iou_x, self.iou_h = nn.Linear(dim, 3 * hidden), nn.Linear(hidden, 3 * hidden)
        self.f_x, self.f_h = nn.Linear(dim, hidden), nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor, hs: list[torch.Tensor], cs: list[torch.Tensor]) -> Any:
        h_sum = torch.stack(hs).sum(0) if hs else torch.zeros(self.hidden)
        i, o, u = (self.iou_x(x) + self.iou_h(h_sum)).chunk(3)
        c = torch.sigmoid(i) * torch.tanh(u)
        fx = self.f_x(x)
        for h_k, c_k in zip(hs, cs, strict=True):
            c = c + torch.sigmoid(fx + self.f_h(h_k)) * c_k
        return torch.sigmoid(o) * torch.tanh(c), c


class ChildSumModel(nn.Module):
    """Embedding, Child-Sum cell and a classifier on every node."""

    def __init__(self, vocab: int = 1000, dim: int = 100, hidden: int = 100) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.cell = ChildSumCell(dim, hidden)
        self.out = nn.Linear(hidden, 5)

    def loss(self, tree: Any) -> torch.Tensor:
        """The summed node loss of one tree ``(word, label, children)``, written per instance."""
        total = torch.zeros(())
        states = []
        for word, label, children in _post_order(tree):
            hs = [states[k][0] for k in children]
            cs = [states[k][1] for k in children]
            h, c = self.cell(self.embed(torch.tensor(word)), hs, cs)
            states.append((h, c))
            total = total + F.cross_entropy(self.out(h), torch.tensor(label))
        return total


def _post_order(tree: Any) -> list[tuple[int, int, list[int]]]:
    """Nodes ``(word, label, child indices)`` with children before parents."""
    out: list[tuple[int, int, list[int]]] = []

    def visit(node: Any) -> int:
        word, label, children = node
        kids = [visit(child) for child in children]
        out.append((word, label, kids))
        return len(out) - 1

    visit(tree)
    return out


def random_child_sum_tree(rng: random.Random, nodes: int) -> Any:
    """A random tree of ``nodes`` nodes, each with 0-5 children."""
    if nodes == 1:
        return (rng.randrange(1000), rng.randrange(5), [])
    k = min(rng.randint(1, 5), nodes - 1)
    sizes = [1] * k
    for _ in range(nodes - 1 - k):
        sizes[rng.randrange(k)] += 1
    children = [random_child_sum_tree(rng, s) for s in sizes]
    return (rng.randrange(1000), rng.randrange(5), children)


def systems(per_instance: Callable[[Any], Any]) -> dict[str, Loss]:
    """The loop and batch_map (each scheduler, module caching on and off) on one function."""

    def loop(batch: Sequence[Any]) -> tuple[torch.Tensor, None]:
        return torch.stack([_total(per_instance(x)) for x in batch]).sum(), None

    def batched(scheduler: str, cache: bool, batch: Sequence[Any]) -> tuple[torch.Tensor, Any]:
        outs, stats = bf.batch_map(
            per_instance,
            batch,
            scheduler=scheduler,  # type: ignore[arg-type]
            cache_modules=cache,
            return_stats=True,
        )
        return torch.stack([_total(o) for o in outs]).sum(), stats

    return {
        "plain loop (eager)": loop,
        "batch_map agenda": partial(batched, "agenda", True),
        "batch_map depth": partial(batched, "depth", True),
        "batch_map agenda, no module cache": partial(batched, "agenda", False),
        "batch_map depth, no module cache": partial(batched, "depth", False),
    }


def _total(out: Any) -> torch.Tensor:
    return torch.stack(out).sum() if isinstance(out, list) else out


def time_training(
    model: nn.Module, loss: Loss, batches: list[list[Any]], repeats: int
) -> dict[str, Any]:
    """Median seconds of a training step (forward, backward, SGD), and batch_map's split."""
    return time_interleaved(model, {"system": loss}, batches, repeats)["system"]


def turns(names: Sequence[str], repeats: int) -> Iterator[tuple[int, str]]:
    """``(round, name)`` for ``repeats + 1`` rounds (round 0 warms up), every name once a
    round, in an order that rotates from round to round."""
    for i in range(repeats + 1):
        turn = i % len(names)
        for name in [*names[turn:], *names[:turn]]:
            yield i, name


def time_interleaved(
    model: nn.Module, systems: dict[str, Loss], batches: list[list[Any]], repeats: int
) -> dict[str, dict[str, Any]]:
    """:func:`time_training` of every system, taking turns round by round: in each round every
    system runs all the batches, in an order that rotates from round to round, so a machine
    that slows down for a while (a shared VM) weighs on all systems alike. A system's batches
    run back to back, as in a training loop: taking turns batch by batch slowed whichever
    system ran right after the eager loop. The first round warms up."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
    names = list(systems)
    times: dict[str, list[float]] = {name: [] for name in names}
    splits: dict[str, list[tuple[float, float, float, int]]] = {name: [] for name in names}
    for i, name in turns(names, repeats):
        for batch in batches:
            start = time.perf_counter()
            value, stats = systems[name](batch)
            optimizer.zero_grad()
            value.backward()
            optimizer.step()
            synchronize()  # a GPU's queued work counts
            if i:
                times[name].append(time.perf_counter() - start)
                if stats is not None:
                    split = (stats.record_s, stats.schedule_s, stats.execute_s, stats.steps)
                    splits[name].append(split)
    rows = {}
    for name in names:
        row: dict[str, Any] = {"median_s": statistics.median(times[name]), "runs": len(times[name])}
        if splits[name]:
            record, sched, execute, steps = (
                statistics.median(s[j] for s in splits[name]) for j in range(4)
            )
            row.update(record_s=record, schedule_s=sched, execute_s=execute, steps=steps)
        rows[name] = row
    return rows


def check(model: nn.Module, loss_systems: dict[str, Loss], batch: list[Any]) -> None:
    """Every system's loss equals the loop's on ``batch``."""
    want = loss_systems["plain loop (eager)"](batch)[0]
    for name, loss in loss_systems.items():
        got = loss(batch)[0]
        if not torch.allclose(got, want, rtol=1e-4, atol=1e-4):
            raise RuntimeError(f"{name}: loss {got.item()} differs from the loop's {want.item()}")


def workloads(quick: bool) -> dict[str, tuple[nn.Module, Callable[[Any], Any], Callable]]:
    """Name -> (model, per-instance function, batch maker ``(size, count) -> batches``)."""
    torch.manual_seed(0)
    binary = TreeLSTMClassifier(1000, 300, 150, n_classes=5)
    child_sum = ChildSumModel()

    def child_sum_batches(size: int, count: int) -> list[list[Any]]:
        rng = random.Random(size)
        return [
            [random_child_sum_tree(rng, rng.randint(20, 60)) for _ in range(size)]
            for _ in range(count)
        ]

    return {
        "binary Tree-LSTM": (
            binary,
            partial(tree_node_losses, binary),
            lambda size, count: make_batches(count, size, seed=size),
        ),
        "Child-Sum Tree-LSTM": (child_sum, child_sum.loss, child_sum_batches),
    }


def run(quick: bool, threads: int, sizes: Sequence[int]) -> dict[str, Any]:
    """Measure every workload, batch size and system; returns the JSON-ready results."""
    torch.set_num_threads(threads)
    rows = []
    for name, (model, per_instance, make) in workloads(quick).items():
        loss_systems = systems(per_instance)
        check(model, loss_systems, make(4, 1)[0])
        for size in sizes:
            batches = make(size, 2 if quick else 3)
            for system, loss in loss_systems.items():
                repeats = 1 if system.startswith("plain") or quick else 2
                row = time_training(model, loss, batches, repeats)
                row.update(workload=name, batch=size, system=system)
                row["trees_per_s"] = size / row["median_s"]
                rows.append(row)
                print(f"{name:20s} b={size:<4d} {system:36s} {row['trees_per_s']:8.1f} trees/s")
    for row in rows:
        loop = next(
            r
            for r in rows
            if r["workload"] == row["workload"]
            and r["batch"] == row["batch"]
            and r["system"].startswith("plain")
        )
        row["vs_loop"] = row["trees_per_s"] / loop["trees_per_s"]
    return {"machine": describe_machine(threads), "rows": rows}


def summary(results: dict[str, Any]) -> str:
    """The results as a markdown table."""
    m = results["machine"]
    head = ["workload", "batch", "system", "trees/s", "vs loop", "steps", "record/sched/exec ms"]
    table = [
        [
            r["workload"],
            r["batch"],
            r["system"],
            f"{r['trees_per_s']:.1f}",
            f"{r['vs_loop']:.2f}x",
            f"{r['steps']:.0f}" if "steps" in r else "",
            f"{r['record_s'] * 1e3:.0f} / {r['schedule_s'] * 1e3:.0f} / {r['execute_s'] * 1e3:.0f}"
            if "record_s" in r
            else "",
        ]
        for r in results["rows"]
    ]
    return (
        f"# batch_map on plainly written per-instance code\n\n{m['cpu']}, {m['cpus']} CPUs, "
        f"{m['threads']} threads, torch {m['torch']}, commit {m['commit']}, {m['date']}.\n"
        "Training steps (forward, backward, SGD), median over repeats.\n\n"
        + markdown_table(head, table)
        + "\n"
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: ``--quick``, ``--threads``, ``--batch-sizes``, ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="batch 64, fewer repeats")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--batch-sizes", type=int, nargs="+", help="default: 64 256 (quick: 64)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for JSON and markdown")
    args = parser.parse_args(argv)
    sizes = args.batch_sizes or ([64] if args.quick else [64, 256])
    results = run(args.quick, args.threads, sizes)
    stem = "lazy-quick" if args.quick else "lazy"
    write_results(args.out, stem, results, summary(results))


if __name__ == "__main__":
    main()
