"""Would compiling the cached module calls pay? ``torch.compile`` on the Tree-LSTM's batched steps.

``batch_map`` runs each cached module call (a macro node) of a step as one batched call of
the module's ops. This measures what running those calls through ``torch.compile`` (inductor,
``dynamic=True``, so one compiled graph serves every step size) would change, on the steps a
real plan has: the binary Tree-LSTM of ``bench_lazy.py`` (embedding 300, hidden 150, random
2-60-leaf trees), trained with ``batch_map`` at batch 256. For every step of the plan that
runs the leaf (``TreeLSTMLeaf``), the cell (``BinaryTreeLSTMCell``) or the classifier head
(``TreeLSTMClassifier``: dropout, off here, and the output layer, whose cached calls are
nodes of its one op), the same module runs on random inputs
of the step's row count, forward and backward, eagerly and compiled; the report sums both
over the plan's steps, beside the whole training step's time and the compile time.

    python benchmarks/bench_compile.py

Writes ``benchmarks/results/compile.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

import batchfold as bf
from baselines import make_batches
from batchfold.models.tree_lstm import TreeLSTMClassifier, tree_node_losses
from machine import describe_machine, markdown_table, write_results

RESULTS = Path(__file__).resolve().parent / "results"


def _inputs(name: str, rows: int) -> tuple[torch.Tensor, ...]:
    width = {"TreeLSTMLeaf": (300,), "BinaryTreeLSTMCell": (150,) * 4}.get(name, (150,))
    return tuple(torch.randn(rows, w, requires_grad=True) for w in width)


def _time(fn: Callable[..., Any], args: tuple[torch.Tensor, ...], repeats: int) -> float:
    """Median seconds of ``fn(*args)`` forward and backward (the first run's, with none
    repeated)."""
    times = []
    for i in range(max(repeats + 2, 1)):  # two warm-up runs
        start = time.perf_counter()
        out = fn(*args)
        total = sum(o.sum() for o in (out if isinstance(out, tuple) else (out,)))
        total.backward()  # type: ignore[union-attr]
        if i >= 2 or not repeats:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def run(threads: int, batch: int, repeats: int) -> dict[str, Any]:
    """Time one training step, then each macro step of its plan eagerly and compiled."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = TreeLSTMClassifier(1000, 300, 150, n_classes=5)
    trees = make_batches(1, batch, seed=batch)[0]

    def step() -> bf.Stats:
        outs, stats = bf.batch_map(
            lambda t: tree_node_losses(model, t), trees, scheduler="depth", return_stats=True
        )
        torch.stack([torch.stack(o).sum() for o in outs]).sum().backward()
        return stats

    stats = step()
    starts = []
    for _ in range(repeats):
        start = time.perf_counter()
        stats = step()
        starts.append(time.perf_counter() - start)
    assert stats.plan is not None
    modules = {
        "TreeLSTMLeaf": model.cell.leaf,
        "BinaryTreeLSTMCell": model.cell,
        "TreeLSTMClassifier": model,
    }
    rows: dict[str, list[int]] = {name: [] for name in modules}
    for s in stats.plan.steps:
        name = s.sig.name
        if name == "linear" and s.sig.out_metas[0].shape == (5,):
            name = "TreeLSTMClassifier"  # the head's one op after dropout: a node of that op
        if name in rows:
            rows[name].append(len(s.nodes))
    results: dict[str, Any] = {
        "machine": describe_machine(threads),
        "batch": batch,
        "training_step_s": statistics.median(starts),
        "modules": {},
    }
    for name, module in modules.items():
        compiled = torch.compile(module, dynamic=True)
        start = time.perf_counter()
        _time(compiled, _inputs(name, max(rows[name], default=1)), 0)
        compile_s = time.perf_counter() - start
        eager = sum(_time(module, _inputs(name, n), repeats) for n in rows[name])
        fast = sum(_time(compiled, _inputs(name, n), repeats) for n in rows[name])
        results["modules"][name] = {
            "steps": len(rows[name]),
            "rows": sum(rows[name]),
            "eager_s": eager,
            "compiled_s": fast,
            "first_compile_s": compile_s,
        }
    return results


def summary(results: dict[str, Any]) -> str:
    """The markdown report."""
    m = results["machine"]
    step = results["training_step_s"]
    head = [
        "module (cached call)",
        "steps",
        "rows",
        "eager ms",
        "compiled ms",
        "saved, % of the training step",
        "first compile s",
    ]
    table = []
    for name, row in results["modules"].items():
        saved = (row["eager_s"] - row["compiled_s"]) / step * 100
        table.append(
            [
                name,
                row["steps"],
                row["rows"],
                f"{row['eager_s'] * 1e3:.1f}",
                f"{row['compiled_s'] * 1e3:.1f}",
                f"{saved:.1f}%",
                f"{row['first_compile_s']:.1f}",
            ]
        )
    return (
        "# Compiled macro steps: the binary Tree-LSTM at batch "
        f"{results['batch']}\n\n"
        f"{m['cpu']}, {m['threads']} threads, torch {m['torch']}, commit {m['commit']}, "
        f"{m['date']}. One `batch_map` training step (depth scheduler): "
        f"{step * 1e3:.0f} ms. Forward and backward of each cached module's batched call, "
        "summed over its steps in that plan, eager and through `torch.compile(dynamic=True)`; "
        "median of repeats.\n\n" + markdown_table(head, table) + "\n"
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: ``--threads``, ``--batch``, ``--repeats``, ``--out``."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--batch", type=int, default=256, help="trees per training step")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for JSON and markdown")
    args = parser.parse_args(argv)
    results = run(args.threads, args.batch, args.repeats)
    write_results(args.out, "compile", results, summary(results))


if __name__ == "__main__":
    main()
