"""TensorFlow Fold's ICLR 2017 benchmark, as its published script defines it, side by side.

The model is the script's Tree-LSTM variant (``FoldBenchmarkCell``): a leaf's state is its row
of an embedding table with 128 rows; an internal node concatenates its children's states, runs
a ``2d -> d`` layer with ReLU, then one ``d -> 4d`` layer giving the left-forget, right-forget,
input and candidate gates, and returns ``f_l * left + f_r * right + i * g`` (no output gate).
Trees are random binary trees with 128 leaves (each split point uniform). One training step is
the forward, Fold's L2 loss on the roots (half their summed squares), the backward and one
SGD update at Fold's rate of 1e-5. The modes are Fold's:

* ``full dynamic``: every tree of every batch has a fresh random shape.
* ``dynamic``: every tree has the same (random) shape; only the leaves' words differ.
* ``manual``: that same shape, batched by hand in plain PyTorch: all leaves in one lookup,
  then one cell call per level (height above the leaves) over every tree of the batch.

Systems (``fold_systems.py``): batchfold runs ordinary per-tree code (``fold_root``) through
``batch_map`` with the cell and the leaf lookup recorded as one node each
(``bf.function(..., batched=True)``; "batchfold agenda", "batchfold depth"), and the same
model as compiled blocks (``fold_blocks``: a ``ForwardDeclaration``, a ``OneOf`` on leaf or
internal node, the leaf lookup and the cell as ``Function`` s; "batchfold blocks agenda",
"batchfold blocks depth"), each with the schedulers of the run;
``manual`` as above; ``manual, node by node`` is what Fold's script timed as TensorFlow (one
batched cell call per node of the shared shape; full runs only); ``naive`` is the same per-tree
code run one tree and one node at a time (batch size 1 only: it does not batch, so its time
per tree does not depend on the batch size); DyNet runs the same model with autobatching,
when its environment is installed (``peers/dynet_fold.py``, the same trees and weights).

Reported per configuration: time per tree (the whole step, recording and scheduling
included; batchfold rows also give it without them, which is what Fold's script timed, as it
built the feed dict outside the timed call), the cost ratio against ``manual`` at the same
batch size, the speedup over ``manual`` at batch size 1 (Fold's "speedup"), peak memory and the
achieved FLOP/s against the measured matmul FLOP/s (``roofline.py``). Batch sizes below 32 run
``32 / batch`` times as many timed steps, as in Fold's script.

    python benchmarks/bench_fold.py                 # state 1024 as published, and 256
    python benchmarks/bench_fold.py --quick         # state 256, batch 1, 32, 256

Writes ``benchmarks/results/fold[-quick].json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from baselines import Timing, split_fields, time_training, timing_fields
from batchfold.data.trees import BinaryTree, random_tree
from batchfold.models.tree_lstm import FoldBenchmarkCell
from batchfold.schedule import Scheduler
from fold_systems import (
    LEAVES,
    VOCAB,
    BatchfoldRunner,
    BlocksRunner,
    ManualRunner,
    NodeByNodeRunner,
    RecordingRunner,
    Runner,
    check_systems,
    level_matmuls,
    make_batch,
    naive_runner,
)
from machine import describe_machine, markdown_table, split_percent, split_progress, spread
from memory import PeakMemory
from peer_runner import PeerUnavailable, loss_agreement, run_peer, write_trees
from roofline import MatmulRates, flops_fields, roofline

RESULTS = Path(__file__).resolve().parent / "results"
LR = 1e-5  # Fold's script


@dataclass
class Config:
    """What a run measures."""

    states: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    repeats: int
    node_by_node: bool
    schedulers: dict[str, tuple[Scheduler, ...]]
    dynet_modes: tuple[int, ...]
    dynet_cap_mb: int
    threads: int
    seed: int = 0


def quick_config(threads: int, repeats: int) -> Config:
    """State 256, batch sizes 1, 32 and 256, the agenda scheduler, DyNet with agenda."""
    return Config(
        states=(256,),
        batch_sizes=(1, 32, 256),
        repeats=repeats,
        node_by_node=False,
        schedulers={"full dynamic": ("agenda",), "dynamic": ("agenda",)},
        dynet_modes=(1,),
        dynet_cap_mb=4096,
        threads=threads,
    )


def full_config(threads: int, repeats: int) -> Config:
    """State 1024 (as published) and 256, every batch size, every system."""
    return Config(
        states=(1024, 256),
        batch_sizes=(1, 32, 64, 128, 256, 1024),
        repeats=repeats,
        node_by_node=True,
        schedulers={"full dynamic": ("agenda", "depth"), "dynamic": ("agenda",)},
        dynet_modes=(0, 1, 2),
        dynet_cap_mb=12288,
        threads=threads,
    )


def run(config: Config) -> dict[str, Any]:
    """Check that the systems agree, then measure every configuration; JSON-ready results."""
    torch.set_num_threads(config.threads)
    check_systems()
    rates = MatmulRates()
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    with tempfile.TemporaryDirectory() as scratch:
        for d in config.states:
            rows += run_state(d, config, rates, Path(scratch), notes)
    return {
        "benchmark": "fold-iclr2017",
        "machine": describe_machine(config.threads),
        "config": {
            "states": config.states,
            "batch_sizes": config.batch_sizes,
            "repeats": config.repeats,
            "leaves": LEAVES,
            "lr": LR,
        },
        "rows": rows,
        "matmul_rates": rates.table(),
        "notes": sorted(set(notes), key=notes.index),
    }


def run_state(
    d: int, config: Config, rates: MatmulRates, scratch: Path, notes: list[str]
) -> list[dict[str, Any]]:
    """Every (batch size, mode, system) at state size ``d``, on one set of initial weights."""
    torch.manual_seed(config.seed)
    cell = FoldBenchmarkCell(VOCAB, d)
    weights = write_weights(cell, scratch / f"fold-{d}.npz")
    if config.dynet_modes:
        notes.append(check_dynet(cell, weights, scratch))
    rng = random.Random(config.seed)
    shape = random_tree(LEAVES, rng, VOCAB, n_classes=1)  # the one shape of dynamic and manual
    rows = []
    for size in config.batch_sizes:
        repeats = config.repeats * max(1, 32 // size)
        for mode in ("dynamic", "full dynamic"):
            batches = [make_batch(mode, shape, size, rng) for _ in range(repeats + 1)]
            flops, roof_s = roofline(level_matmuls(batches[1], d), rates, training=True)
            found = []
            for name, runner in systems_for(mode, size, cell, shape, config).items():
                row = measure(runner, cell, batches, repeats)
                found.append({"state": d, "mode": mode_of(name, mode), "system": name, **row})
            found += dynet_rows(config, d, size, mode, batches, weights, scratch, notes)
            for row in found:
                row.update(batch_size=size, **flops_fields(flops, roof_s, row["median_s"], size))
                rows.append(row)
                print(format_row(row), flush=True)
    return rows


def mode_of(system: str, mode: str) -> str:
    """The Fold column of a system: the hand-built systems are ``manual``."""
    return "manual" if system.startswith("manual") else mode


def systems_for(
    mode: str, size: int, cell: FoldBenchmarkCell, shape: BinaryTree, config: Config
) -> dict[str, Runner]:
    """The in-process systems of one (mode, batch size): manual ones run with ``dynamic``."""
    systems: dict[str, Runner] = {}
    if mode == "dynamic":
        systems["manual"] = ManualRunner(cell, shape)
        if config.node_by_node:
            systems["manual, node by node"] = NodeByNodeRunner(cell, shape)
        if size == 1:
            systems["naive per tree"] = naive_runner(cell)
    for scheduler in config.schedulers[mode]:
        systems[f"batchfold {scheduler}"] = BatchfoldRunner(cell, scheduler)
    for scheduler in config.schedulers[mode]:
        systems[f"batchfold blocks {scheduler}"] = BlocksRunner(cell, scheduler)
    return systems


def measure(
    runner: Runner, cell: FoldBenchmarkCell, batches: list[list[BinaryTree]], repeats: int
) -> dict[str, Any]:
    """Time training steps of one system; its row with time, spread, memory and time split."""
    sgd = torch.optim.SGD(cell.parameters(), lr=LR)
    if isinstance(runner, RecordingRunner):
        runner.stats.clear()
    with PeakMemory() as peak:
        timing = time_training(runner, batches, sgd, warmup=1, repeats=repeats)
    row = fold_timing_fields(timing)
    row.update(peak.as_dict())
    if isinstance(runner, RecordingRunner):
        stats = runner.stats[1:]
        row.update(split_fields(stats))
        # What Fold's script timed: the step without recording and scheduling.
        row["without_record_schedule_s"] = statistics.median(
            t - s.record_s - s.schedule_s for s, t in zip(stats, timing.times, strict=True)
        )
    return row


def fold_timing_fields(timing: Timing) -> dict[str, Any]:
    """A timing's row fields (``baselines.timing_fields``) with Fold's time per tree."""
    return {**timing_fields(timing), "ms_per_tree": 1e3 * timing.median_s / timing.batch_size}


def write_weights(cell: FoldBenchmarkCell, path: Path) -> Path:
    """The cell's weights in ``peers/dynet_fold.py``'s layout."""
    arrays = {
        "embedding": cell.embedding.weight,
        "hidden_W": cell.hidden_layer.weight,
        "hidden_b": cell.hidden_layer.bias,
        "gate_W": cell.gate_layer.weight,
        "gate_b": cell.gate_layer.bias,
    }
    np.savez(path, **{k: v.detach().numpy() for k, v in arrays.items()})
    return path


def dynet_memory(d: int, size: int) -> tuple[str, int]:
    """DyNet's pools (``--dynet-mem`` forward, backward, parameters, scratch) and their total.

    About 12.5 kB per state element per tree were needed for the forward values (measured at
    state 256); the pools get twice that, as DyNet cannot grow them while autobatching.
    """
    forward = int(25e3 * d * size / 2**20) + 64
    params = int(3 * 4 * (VOCAB * d + 6 * d * d + 5 * d) / 2**20) + 16
    scratch = forward // 4 + 32
    return f"{forward},{forward},{params},{scratch}", 2 * forward + params + scratch


def check_dynet(cell: FoldBenchmarkCell, weights: Path, scratch: Path) -> str:
    """Whether DyNet's loss on four trees, with the same weights, matches the naive run's."""
    rng = random.Random(1)
    trees = [random_tree(LEAVES, rng, VOCAB, n_classes=1) for _ in range(4)]
    path = write_trees(trees, scratch / "check.json")
    mem, _ = dynet_memory(cell.d, len(trees))
    args = [str(path), "--weights", str(weights), "--autobatch", "1", "--mem", mem, "--loss-only"]
    try:
        (line,) = run_peer("dynet", "dynet_fold.py", args)
    except PeerUnavailable as error:
        return f"dynet: {error}" if "not installed" in str(error) else f"dynet check: {error}"
    with torch.no_grad():
        expected = float(naive_runner(cell)(trees))
    return f"dynet, state {cell.d}: " + loss_agreement(line["loss"], expected, len(trees))


def dynet_rows(
    config: Config,
    d: int,
    size: int,
    mode: str,
    batches: list[list[BinaryTree]],
    weights: Path,
    scratch: Path,
    notes: list[str],
) -> list[dict[str, Any]]:
    """DyNet on the same trees and weights, one process per autobatch mode (see the peer)."""
    if not config.dynet_modes:
        return []
    trees = write_trees([t for b in batches for t in b], scratch / "trees.json")
    mem, total = dynet_memory(d, size)
    out = []
    for autobatch in config.dynet_modes:
        label = f"dynet {('none', 'agenda', 'depth')[autobatch]}"
        if autobatch == 0 and size > 1:
            continue  # no batching: the time per tree is that of batch size 1
        if total > config.dynet_cap_mb:
            notes.append(f"{label}, state {d}, batch {size}: skipped, needs ~{total} MB of pools")
            continue
        args = [str(trees), "--weights", str(weights), "--batch-sizes", str(size)]
        args += ["--repeats", str(len(batches) - 1), "--autobatch", str(autobatch)]
        args += ["--mem", mem, "--lr", str(LR)]
        try:
            (line,) = run_peer("dynet", "dynet_fold.py", args)
        except PeerUnavailable as error:
            if "not installed" in str(error):
                notes.append(f"dynet: {error}")
                return out
            notes.append(f"{label}, state {d}, batch {size}: {error}")
            continue
        out.append(
            {
                "state": d,
                "mode": mode,
                "system": label,
                "batch_size": size,
                **fold_timing_fields(Timing(line["times_s"], size)),
                "peak_mb": line["peak_mb"],
                "resident_peak_mb": line["resident_peak_mb"],
                "peak_method": line["peak_method"],
                "dynet_mem_mb": mem,
                "threads": 1,
                "version": f"dynet38 {line['version']}",
            }
        )
    return out


def format_row(r: dict[str, Any]) -> str:
    """A progress line."""
    return (
        f"state {r['state']:>4d} {r['mode']:>12s} b={r['batch_size']:<4d} {r['system']:<24s} "
        f"{r['ms_per_tree']:9.2f} ms/tree  peak {r['peak_mb']:7.1f} MB  "
        f"{100 * r['flops_fraction']:4.0f}% of matmul FLOP/s{split_progress(r)}"
    )


def summary(results: dict[str, Any]) -> str:
    """The markdown report: Fold's table per state size, with memory, FLOP/s and time split."""
    rows = results["rows"]
    m = results["machine"]
    parts = [
        "# TensorFlow Fold's ICLR 2017 benchmark\n",
        f"{m['cpu']}, {m['cpus']} CPUs, {m['threads']} threads, torch {m['torch']}, "
        f"commit {m['commit']}, {m['date']}\n",
        "Time per tree of one training step (forward, L2 loss, backward, SGD). Ratio: against "
        "`manual` at the same batch size. Speedup: `manual` at batch size 1 over this. "
        "FLOP/s: achieved, as a share of torch.mm's at the same sizes. Peak: the rise of "
        "resident memory during the configuration (DyNet: its preallocated pools are "
        "`dynet_mem_mb` in the JSON). Split: batchfold's record / schedule / forward "
        "execution, % of the step; 'no rec+sched': ms per tree without recording and "
        "scheduling (what Fold's script timed); record us/node: recording time per graph "
        "node. batchfold agenda/depth run per-tree code through `batch_map`; batchfold "
        "blocks agenda/depth run the same model as compiled blocks.\n",
    ]
    for d in sorted({r["state"] for r in rows}, reverse=True):
        mine = [r for r in rows if r["state"] == d]
        manual = {r["batch_size"]: r["ms_per_tree"] for r in mine if r["system"] == "manual"}
        base = manual.get(1)
        table = []
        for r in mine:
            ratio = (
                r["ms_per_tree"] / manual[r["batch_size"]] if r["batch_size"] in manual else None
            )
            no_rs = per_node = ""
            if "record_s" in r:
                no_rs = f"{1e3 * r['without_record_schedule_s'] / r['batch_size']:.2f}"
                per_node = f"{r['record_us_per_node']:.1f}"
            table.append(
                [
                    r["batch_size"],
                    r["mode"],
                    r["system"],
                    f"{r['ms_per_tree']:.2f}",
                    spread(r),
                    "" if ratio is None else f"{ratio:.2f}",
                    "" if base is None else f"{base / r['ms_per_tree']:.1f}x",
                    f"{100 * r['flops_fraction']:.0f}%",
                    f"{r['peak_mb']:.0f}",
                    split_percent(r),
                    no_rs,
                    per_node,
                ]
            )
        head = [
            "batch",
            "mode",
            "system",
            "ms/tree",
            "spread",
            "ratio",
            "speedup",
            "FLOP/s",
            "peak MB",
            "split %",
            "no rec+sched ms/tree",
            "record us/node",
        ]
        name = "as published" if d == 1024 else "smaller than published"
        parts.append(f"\n## State size {d} ({name})\n\n" + markdown_table(head, table) + "\n")
    if results["notes"]:
        parts.append("\n" + "\n".join(f"- {note}" for note in results["notes"]) + "\n")
    return "\n".join(parts)


def main(argv: Sequence[str] | None = None) -> None:
    """Run, print, and write JSON and markdown."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="state 256, batch 1, 32, 256")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--repeats", type=int, default=2, help="timed steps (x 32/batch below 32)")
    parser.add_argument("--states", type=int, nargs="+", help="state sizes (default per mode)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", help="batch sizes")
    parser.add_argument("--no-peers", action="store_true", help="leave DyNet out")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for JSON and markdown")
    args = parser.parse_args(argv)
    config = (quick_config if args.quick else full_config)(args.threads, args.repeats)
    if args.states:
        config.states = tuple(args.states)
    if args.batch_sizes:
        config.batch_sizes = tuple(args.batch_sizes)
    if args.no_peers:
        config.dynet_modes = ()
    results = run(config)
    results["quick"] = args.quick
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "fold-quick" if args.quick else "fold"
    (args.out / f"{stem}.json").write_text(json.dumps(results, indent=1))
    (args.out / f"{stem}.md").write_text(summary(results))
    print(summary(results))


if __name__ == "__main__":
    main()
