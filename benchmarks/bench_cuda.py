"""Binary Tree-LSTM training throughput on a CUDA GPU: naive, hand-written, batchfold.

The systems and the model are ``bench_treelstm.py``'s (embedding 300, hidden 150, 5 classes, a
cross-entropy on every node, an SGD step), on its random trees with 2-60 leaves, at batch
sizes 32 and 256, training only: naive per-tree PyTorch, the hand-written (routed) level
batching, batchfold blocks and batchfold ``batch_map`` (cells as ``bf.function`` and plain
code), each with both schedulers. Before timing, every system's loss and gradients are
checked against the naive run on the GPU (a small float64 model); a system that fails the
check or raises is reported and left out. Timings synchronise CUDA after the warm-up and
after every step (``baselines.synchronize``).

    python benchmarks/bench_cuda.py [--out DIR]

Writes ``cuda.json`` and ``cuda.md`` to ``benchmarks/results`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from baselines import loss_and_grads
from batchfold.models.tree_lstm import TreeLSTMClassifier
from bench_treelstm import (
    CLASSES,
    EMB,
    HIDDEN,
    RESULTS,
    make_systems,
    measure,
    random_workload,
)
from machine import describe_machine, markdown_table

SIZES = (32, 256)


def check(device: torch.device) -> dict[str, str]:
    """Each system's agreement with the naive run on 4 trees, float64 on ``device``."""
    trees = random_workload().batches(4, 1)[0]
    torch.manual_seed(0)
    model = TreeLSTMClassifier(1000, 8, 6, n_classes=CLASSES).double().to(device)
    systems = make_systems(model, quick=True)
    expected = loss_and_grads("naive per-tree", systems["naive per-tree"], model, trees)
    found = {}
    for name, runner in systems.items():
        try:
            got = loss_and_grads(name, runner, model, trees)
            same = all(
                torch.allclose(a, b, rtol=1e-9, atol=1e-12)
                for a, b in zip(got, expected, strict=True)
            )
            found[name] = "ok" if same else "differs from the naive run"
        except Exception as error:  # reported, and the system is left out of the timings
            found[name] = f"{type(error).__name__}: {error}"
    return found


def run(threads: int) -> dict[str, Any]:
    """Check, then time every system that passed; the JSON-ready results."""
    torch.set_num_threads(threads)
    device = torch.device("cuda", torch.cuda.current_device())
    checks = check(device)
    torch.manual_seed(0)
    model = TreeLSTMClassifier(1000, EMB, HIDDEN, n_classes=CLASSES).to(device)
    systems = {k: v for k, v in make_systems(model, quick=True).items() if checks[k] == "ok"}
    rows = []
    for size in SIZES:
        batches = random_workload().batches(size, 6)
        for name, runner in systems.items():
            slow = name == "naive per-tree"  # seconds per step: few of them
            repeats = (1 if size >= 256 else 2) if slow else 5
            warmup = 0 if slow and size >= 256 else 1  # the GPU is warm by then
            torch.cuda.synchronize()
            row = measure(runner, model, batches, "training", repeats, warmup)
            rows.append({"batch_size": size, "system": name, **row})
            print(f"b={size:4d} {name:32s} {row['trees_per_s']:9.1f} trees/s", flush=True)
    return {
        "benchmark": "tree-lstm-cuda",
        "machine": describe_machine(threads),
        "gpu": torch.cuda.get_device_name(device),
        "checks": checks,
        "rows": rows,
    }


def summary(results: dict[str, Any]) -> str:
    """The markdown report: GPU, versions, date, and trees/s per system and batch size."""
    m = results["machine"]
    naive = {r["batch_size"]: r["trees_per_s"] for r in results["rows"] if "naive" in r["system"]}
    table = [
        [
            r["batch_size"],
            r["system"],
            f"{r['trees_per_s']:.1f}",
            f"{r['trees_per_s'] / naive[r['batch_size']]:.1f}x" if naive else "",
            len(r["times_s"]),
            f"{r['peak_cuda_mb']:.0f}" if r.get("peak_cuda_mb") is not None else "",
        ]
        for r in results["rows"]
    ]
    failed = [f"- {k}: {v}" for k, v in results["checks"].items() if v != "ok"]
    return "\n".join(
        [
            "# Tree-LSTM training on CUDA",
            "",
            f"{results['gpu']}, torch {m['torch']}, {m['cpu']} ({m['threads']} threads), "
            f"commit {m['commit']}, {m['date']}",
            "",
            "Random binary trees with 2-60 leaves; embedding 300, hidden 150, float32; a "
            "training step is forward, backward and SGD; median of the timed steps.",
            "",
            markdown_table(
                ["batch", "system", "trees/s", "vs naive", "steps", "peak GPU MB"], table
            ),
            "",
            *(["Left out (failed the check against the naive run):", *failed] if failed else []),
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for JSON and markdown")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_cuda.py needs a CUDA GPU")
    results = run(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cuda.json").write_text(json.dumps(results, indent=1))
    (args.out / "cuda.md").write_text(summary(results) + "\n")
    print(summary(results))


if __name__ == "__main__":
    main()
