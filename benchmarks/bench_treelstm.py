"""Binary Tree-LSTM: naive per-tree PyTorch, hand-written level batching, batchfold, and peers.

All in-process systems run on the same model weights and the same trees: embedding 300,
hidden 150, a 5-class cross-entropy on every node; batch sizes 1, 32 and 256; inference and
training (forward, backward and an SGD step). Workloads: random binary trees with 2-60
leaves, complete binary trees with 128 leaves, and the Stanford Sentiment Treebank's training
trees (word ids from a vocabulary of the training words) when the data is present. batchfold
runs through both of its front ends, each with each scheduler: ordinary per-tree code (the
same code the naive baseline runs, ``tree_node_losses``) through ``batch_map``: as written
("plain code", module calls recorded as cached traces) and with the cell wrapped in
``bf.function`` ("batchfold agenda", "batchfold depth"); and the same model written as blocks
(``tree_lstm_blocks``, compiled with ``batchfold.blocks.compile``: "batchfold blocks
agenda", "batchfold blocks depth"), whose loss is the sum of its ``"loss"`` metric, and as a
user writes it in blocks, a ``Function`` per step (``user_blocks.py``: "batchfold blocks
agenda, as a user writes them"). Before
timing, every in-process system's loss and gradients are checked against the naive run on a
few trees of each workload (float64).

The peers run the same model on the same trees from the same initial weights, each in its own
environment (``peers/``): DyNet without autobatching, with its agenda and its depth
heuristic, and DGL (``prop_nodes_topo``) with graphs batched inside the timed step and batched
beforehand. A peer that is not installed is reported as such.

Every row has the median step time and its spread, the peak memory (``memory.py``), the
achieved FLOP/s as a share of the measured matmul FLOP/s at the sizes of the level-batched run
(``roofline.py``), and for batchfold the record / schedule / execute split and the recording
time per graph node.

    python benchmarks/bench_treelstm.py            # full run
    python benchmarks/bench_treelstm.py --quick    # random and SST trees, batch 32 and 256

Writes ``benchmarks/results/treelstm[-quick].json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

import batchfold as bf
from baselines import (
    Timing,
    flatten_trees,
    level_batched_loss,
    loss_and_grads,
    make_batches,
    naive_batch_loss,
    routed_level_batched_loss,
    split_fields,
    time_inference,
    time_training,
    timing_fields,
)
from batchfold import blocks
from batchfold.data.paths import find_data
from batchfold.data.trees import BinaryTree, complete_tree
from batchfold.models.tree_lstm import TreeLSTMClassifier, tree_node_losses
from batchfold.models.tree_lstm_blocks import tree_lstm_blocks
from batchfold.schedule import Scheduler
from machine import describe_machine, markdown_table, split_percent, split_progress, spread
from memory import PeakMemory
from peer_runner import PeerUnavailable, loss_agreement, run_peer, write_trees
from roofline import Matmul, MatmulRates, flops_fields, roofline
from user_blocks import user_tree_lstm_blocks

RESULTS = Path(__file__).resolve().parent / "results"
EMB, HIDDEN, CLASSES = 300, 150, 5
LR = 1e-4  # the loss is a sum over ~15,000 nodes at batch size 256: larger rates diverge
Runner = Callable[[Sequence[BinaryTree]], torch.Tensor]


class BatchfoldRunner:
    """A batch's loss through ``batch_map``; keeps the stats of every call."""

    def __init__(self, model: TreeLSTMClassifier, scheduler: Scheduler, fused: bool):
        self.model = model
        self.scheduler: Scheduler = scheduler
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


class BlocksRunner:
    """A batch's loss through the Tree-LSTM written as blocks; keeps the stats of every call.

    The compiled model uses ``model``'s own modules, so it shares their weights.

    Arguments:
        model: the classifier.
        scheduler: ``"agenda"`` or ``"depth"``.
        build: makes the blocks from the model (the tuned ``tree_lstm_blocks``, or
            ``user_tree_lstm_blocks``, a block per step as a user writes them).
    """

    def __init__(
        self,
        model: TreeLSTMClassifier,
        scheduler: Scheduler,
        build: Callable[[TreeLSTMClassifier], Any] = tree_lstm_blocks,
    ) -> None:
        self.compiled = blocks.compile(build(model), scheduler=scheduler)
        self.stats: list[bf.Stats] = []

    def __call__(self, trees: Sequence[BinaryTree]) -> torch.Tensor:
        _, metrics = self.compiled(trees)
        assert self.compiled.last_stats is not None
        self.stats.append(self.compiled.last_stats)
        return metrics["loss"].sum()


RecordingRunner = BatchfoldRunner | BlocksRunner  # the systems that keep stats


@dataclass
class Workload:
    """Trees to batch: a name, the vocabulary size, and a batch maker."""

    name: str
    vocab_size: int
    batches: Callable[[int, int], list[list[BinaryTree]]]  # (batch size, count) -> batches


def random_workload() -> Workload:
    """Random binary trees with 2-60 leaves."""
    return Workload(
        "random 2-60 leaves", 1000, lambda size, n: make_batches(n, size, 2, 60, seed=size)
    )


def complete_workload() -> Workload:
    """Complete binary trees with 128 leaves."""

    def batches(size: int, n: int) -> list[list[BinaryTree]]:
        rng = random.Random(size)
        return [
            [complete_tree(n_leaves=128, rng=rng, vocab_size=1000) for _ in range(size)]
            for _ in range(n)
        ]

    return Workload("complete 128 leaves", 1000, batches)


def sst_workload() -> Workload | None:
    """The SST training trees in a fixed shuffled order, or None when the data is absent."""
    if find_data("sst") is None:
        return None
    from batchfold.data.sst import load_sst
    from batchfold.data.vocab import Vocab

    train = load_sst("train")
    vocab = Vocab(word for tree in train for word in tree.words())
    trees = [sst_tree(t, vocab) for t in train]
    random.Random(0).shuffle(trees)

    def batches(size: int, n: int) -> list[list[BinaryTree]]:
        if size * n > len(trees):
            raise ValueError(f"SST has {len(trees)} training trees, fewer than {n} x {size}")
        return [trees[i * size : (i + 1) * size] for i in range(n)]

    return Workload("sst train", len(vocab), batches)


def sst_tree(tree: Any, vocab: Any) -> BinaryTree:
    """An SST tree as a :class:`BinaryTree` with word ids; a one-child node is its child."""
    stack: list[BinaryTree] = []
    for node in tree.nodes():  # post-order
        if node.word is not None:
            stack.append(BinaryTree.leaf(vocab.lookup(node.word), node.label))
        elif len(node.children) == 2:
            right, left = stack.pop(), stack.pop()
            stack.append(BinaryTree.node(left, right, node.label))
    return stack[0]


def treelstm_matmuls(trees: Sequence[BinaryTree]) -> list[Matmul]:
    """The matmuls of the level-batched run: leaf gates, one cell call per level, outputs."""
    offsets = flatten_trees(trees).offsets
    sizes = np.diff(offsets).tolist()
    out = [Matmul(sizes[0], EMB, 3 * HIDDEN)]
    out += [Matmul(m, 2 * HIDDEN, 5 * HIDDEN) for m in sizes[1:]]
    return out + [Matmul(offsets[-1], HIDDEN, CLASSES)]


def make_systems(model: TreeLSTMClassifier, quick: bool) -> dict[str, Runner]:
    """The in-process systems on one model.

    "hand-written level batching" is the routed level batching
    (:func:`~baselines.routed_level_batched_loss`); full runs add the older baseline that
    concatenates every level's states again at each level
    (:func:`~baselines.level_batched_loss`).
    """
    systems: dict[str, Runner] = {
        "naive per-tree": partial(naive_batch_loss, model),
        "hand-written level batching": partial(routed_level_batched_loss, model),
    }
    if not quick:
        systems["hand-written level batching, re-concatenated"] = partial(level_batched_loss, model)
    systems |= {
        "batchfold agenda": BatchfoldRunner(model, "agenda", fused=True),
        "batchfold depth": BatchfoldRunner(model, "depth", fused=True),
        "batchfold blocks agenda": BlocksRunner(model, "agenda"),
        "batchfold blocks depth": BlocksRunner(model, "depth"),
        # the same model as a user writes blocks, a Function per step (user_blocks.py)
        "batchfold blocks agenda, as a user writes them": BlocksRunner(
            model, "agenda", user_tree_lstm_blocks
        ),
        # the per-tree code as written, no bf.function: module calls become cached traces
        "batchfold agenda, plain code": BatchfoldRunner(model, "agenda", fused=False),
        "batchfold depth, plain code": BatchfoldRunner(model, "depth", fused=False),
    }
    return systems


def check_systems(workloads: Sequence[Workload], seed: int = 0) -> None:
    """Every in-process system's loss and gradients equal the naive run's, on each workload.

    A small float64 classifier (embedding 8, hidden 6, the workload's vocabulary) runs the
    first batch of 4 trees of each workload through every system of a full run, both
    hand-written level batchings (routed and re-concatenated) included.

    Raises:
        RuntimeError: a system disagrees; the message names it and the workload.
    """
    for workload in workloads:
        trees = workload.batches(4, 1)[0]
        torch.manual_seed(seed)
        model = TreeLSTMClassifier(workload.vocab_size, 8, 6, n_classes=CLASSES).double()
        systems = make_systems(model, quick=False)
        expected = loss_and_grads("naive per-tree", systems.pop("naive per-tree"), model, trees)
        for name, runner in systems.items():
            got = loss_and_grads(name, runner, model, trees)
            if not all(
                torch.allclose(a, b, rtol=1e-9, atol=1e-12)
                for a, b in zip(got, expected, strict=True)
            ):
                raise RuntimeError(f"{name} ({workload.name}) does not match the naive run")


WORKLOADS = ("random", "complete", "sst")


def run(
    quick: bool,
    threads: int,
    peers: bool,
    names: Sequence[str] | None = None,
    sizes: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Measure every configuration; returns the JSON-ready results.

    Arguments:
        quick: random and SST trees, batch 32 and 256, fewer repeats, and
            the peers on the random trees only.
        threads: torch intra-op threads.
        peers: run DyNet and DGL too.
        names: the workloads, out of :data:`WORKLOADS` (default: per ``quick``).
        sizes: the batch sizes (default: per ``quick``).
    """
    torch.set_num_threads(threads)
    rates = MatmulRates()
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    workloads = load_workloads(names or (("random", "sst") if quick else WORKLOADS), notes)
    sizes = sizes or ([32, 256] if quick else [1, 32, 256])
    check_systems(workloads)
    with tempfile.TemporaryDirectory() as scratch:
        for workload in workloads:
            with_peers = peers and (workload.name == "random 2-60 leaves" or not quick)
            rows += run_workload(workload, sizes, quick, with_peers, rates, Path(scratch), notes)
    return {
        "benchmark": "tree-lstm",
        "machine": describe_machine(threads),
        "rows": rows,
        "matmul_rates": rates.table(),
        "notes": sorted(set(notes), key=notes.index),
    }


def load_workloads(names: Sequence[str], notes: list[str]) -> list[Workload]:
    """The named workloads; SST is left out, with a note, when its data is absent."""
    workloads = []
    for name in names:
        if name == "sst":
            sst = sst_workload()
            if sst is None:
                notes.append("sst train: skipped, the SST data is not present")
            else:
                workloads.append(sst)
        else:
            workloads.append(random_workload() if name == "random" else complete_workload())
    return workloads


def run_workload(
    workload: Workload,
    sizes: Sequence[int],
    quick: bool,
    peers: bool,
    rates: MatmulRates,
    scratch: Path,
    notes: list[str],
) -> list[dict[str, Any]]:
    """Every (batch size, mode, system) of one workload, on one set of initial weights."""
    torch.manual_seed(0)
    model = TreeLSTMClassifier(workload.vocab_size, EMB, HIDDEN, n_classes=CLASSES)
    systems = make_systems(model, quick)
    weights = write_weights(model, scratch / "weights.npz")
    if peers:
        notes += check_peers(model, workload, weights, scratch)
    rows = []
    for size in sizes:
        repeats = (2 if quick else 3) * max(1, 32 // size)
        batches = workload.batches(size, repeats + 1)
        matmuls = treelstm_matmuls(batches[1])
        for mode in ("inference", "training"):
            found = []
            for name, runner in systems.items():
                slow = name == "naive per-tree" and size >= 256  # one step is plenty
                timed = 1 if slow else repeats
                row = measure(runner, model, batches, mode, timed, warmup=0 if slow else 1)
                found.append({"workload": workload.name, "mode": mode, "system": name, **row})
            if peers:
                for row in peer_rows(workload, size, mode, batches, weights, scratch, quick):
                    if "error" in row:
                        notes.append(row["error"])
                    else:
                        found.append(row)
            flops, roof_s = roofline(matmuls, rates, training=mode == "training")
            for row in found:
                row.update(batch_size=size, **flops_fields(flops, roof_s, row["median_s"], size))
                rows.append(row)
                print(format_row(row), flush=True)
    return rows


def measure(
    runner: Runner,
    model: torch.nn.Module,
    batches: list[list[BinaryTree]],
    mode: str,
    repeats: int,
    warmup: int,
) -> dict[str, Any]:
    """Time one configuration; its row with times, spread, memory and batchfold's split."""
    if isinstance(runner, RecordingRunner):
        runner.stats.clear()
    with PeakMemory() as peak:
        if mode == "inference":
            timing = time_inference(runner, batches, warmup=warmup, repeats=repeats)
        else:
            sgd = torch.optim.SGD(model.parameters(), lr=LR)
            timing = time_training(runner, batches, sgd, warmup=warmup, repeats=repeats)
    row = timing_fields(timing)
    row.update(peak.as_dict())
    if isinstance(runner, RecordingRunner) and runner.stats:
        row.update(split_fields(runner.stats[warmup:]))
    return row


def write_weights(model: TreeLSTMClassifier, path: Path) -> Path:
    """The model's weights in the peers' layout (``peers/treeio.py``)."""
    cell = model.cell
    arrays = {
        "embedding": model.embedding.weight,
        "leaf_W": cell.leaf.gates.weight,  # rows i, o, u: the order of the peers' layout
        "leaf_b": cell.leaf.gates.bias,
        "internal_U": cell.node_gates.weight,  # rows i, f_l, f_r, o, u
        "internal_b": cell.node_gates.bias,
        "out_W": model.output.weight,
        "out_b": model.output.bias,
    }
    np.savez(path, **{k: v.detach().numpy() for k, v in arrays.items()})
    return path


PEERS: dict[str, tuple[str, str, list[str]]] = {
    # system name: (environment, script, mode arguments)
    "dynet none": ("dynet", "dynet_treelstm.py", ["--autobatch", "0"]),
    "dynet agenda": ("dynet", "dynet_treelstm.py", ["--autobatch", "1"]),
    "dynet depth": ("dynet", "dynet_treelstm.py", ["--autobatch", "2"]),
    "dgl, batching in the step": ("dgl", "dgl_treelstm.py", ["--modes", "inloop"]),
    "dgl, graphs batched beforehand": ("dgl", "dgl_treelstm.py", ["--modes", "prebuilt"]),
}


def dynet_memory(trees: Sequence[BinaryTree]) -> str:
    """DyNet's pools for a batch of these trees (it cannot grow them while autobatching)."""
    nodes = sum(t.size for t in trees)
    forward = int(2 * nodes * 16e3 / 2**20) + 128  # ~16 kB of values per node, twice over
    return f"{forward},{forward},256,{forward // 2}"


def peer_rows(
    workload: Workload,
    size: int,
    mode: str,
    batches: list[list[BinaryTree]],
    weights: Path,
    scratch: Path,
    quick: bool,
) -> list[dict[str, Any]]:
    """Every peer on the same trees: one process per (system, phase); errors as rows."""
    trees = write_trees([t for b in batches for t in b], scratch / "trees.json")
    common = [str(trees), "--weights", str(weights), "--batch-sizes", str(size)]
    common += ["--repeats", "1" if quick else "2", "--warmup", "1", "--lr", str(LR)]
    common += ["--vocab", str(workload.vocab_size)]
    common += ["--no-infer"] if mode == "training" else ["--no-train"]
    out: list[dict[str, Any]] = []
    for system, (env, script, extra) in PEERS.items():
        if quick and system == "dgl, graphs batched beforehand":
            continue
        args = common + extra
        if env == "dynet":
            args += ["--mem", dynet_memory(batches[0])]
        else:
            args += ["--threads", str(torch.get_num_threads())]
        try:
            (line,) = run_peer(env, script, args)
        except PeerUnavailable as error:
            where = env if "not installed" in str(error) else f"{system}, {workload.name}, b={size}"
            out.append({"error": f"{where}: {error}"})
            continue
        per_pass = line["train_times_s" if mode == "training" else "infer_times_s"]
        steps = line["trees_per_pass"] / size
        times = [t / steps for t in per_pass]  # seconds per step of `size` trees
        out.append(
            {
                "workload": workload.name,
                "mode": mode,
                "batch_size": size,
                "system": system,
                **timing_fields(Timing(times, size)),
                "peak_mb": line["peak_mb"],
                "resident_peak_mb": line["resident_peak_mb"],
                "peak_method": line["peak_method"],
                "threads": line["threads"],
                "version": line["version"],
            }
        )
    return out


def check_peers(
    model: TreeLSTMClassifier, workload: Workload, weights: Path, scratch: Path
) -> list[str]:
    """Whether each peer's loss on a few trees, from the same weights, matches batchfold's."""
    trees = workload.batches(4, 1)[0]
    path = write_trees(trees, scratch / "check.json")
    with torch.no_grad():
        expected = float(naive_batch_loss(model, trees))
    notes = []
    for env, script in (("dynet", "dynet_treelstm.py"), ("dgl", "dgl_treelstm.py")):
        args = [str(path), "--weights", str(weights), "--vocab", str(workload.vocab_size)]
        args += ["--loss-only"] + (["--autobatch", "1"] if env == "dynet" else [])
        try:
            (line,) = run_peer(env, script, args)
        except PeerUnavailable as error:
            notes.append(f"{env}: {error}")
            continue
        notes.append(
            f"{env}, {workload.name}: " + loss_agreement(line["loss"], expected, len(trees))
        )
    return notes


def format_row(r: dict[str, Any]) -> str:
    """A progress line."""
    return (
        f"{r['workload']:>20s} {r['mode']:>9s} b={r['batch_size']:<4d} {r['system']:<30s} "
        f"{r['trees_per_s']:9.1f} trees/s  peak {r['peak_mb']:7.1f} MB  "
        f"{100 * r['flops_fraction']:4.0f}% of matmul FLOP/s{split_progress(r)}"
    )


def summary(results: dict[str, Any]) -> str:
    """The markdown report: throughput, ratios, memory, FLOP/s and time split."""
    rows = results["rows"]
    base = {(r["workload"], r["mode"], r["batch_size"], r["system"]): r for r in rows}
    table = []
    for r in rows:
        key = (r["workload"], r["mode"], r["batch_size"])
        naive = base.get((*key, "naive per-tree"))
        hand = base.get((*key, "hand-written level batching"))
        per_node = f"{r['record_us_per_node']:.1f}" if "record_s" in r else ""
        table.append(
            [
                r["workload"],
                r["mode"],
                r["batch_size"],
                r["system"],
                f"{r['trees_per_s']:.1f}",
                spread(r),
                f"{r['trees_per_s'] / naive['trees_per_s']:.1f}x" if naive else "",
                f"{r['trees_per_s'] / hand['trees_per_s']:.2f}x" if hand else "",
                f"{100 * r['flops_fraction']:.0f}%",
                f"{r['peak_mb']:.0f}",
                split_percent(r),
                per_node,
            ]
        )
    head = [
        "workload",
        "mode",
        "batch",
        "system",
        "trees/s",
        "spread",
        "vs naive",
        "vs hand-written",
        "FLOP/s",
        "peak MB",
        "record / schedule / execute-forward, % of step",
        "record us/node",
    ]
    m = results["machine"]
    notes = "".join(f"- {note}\n" for note in results["notes"])
    return (
        f"# Tree-LSTM benchmark\n\n{m['cpu']}, {m['cpus']} CPUs, {m['threads']} threads, "
        f"torch {m['torch']}, commit {m['commit']}, {m['date']}\n\n"
        "Spread: (max - min) / median of the timed steps. FLOP/s: achieved, as a share of "
        "torch.mm's at the sizes of the level-batched run. Peak: the rise of resident memory "
        "during the configuration (DyNet preallocates its pools; see the JSON). batchfold "
        "agenda/depth run per-tree code through `batch_map`; batchfold blocks agenda/depth "
        "run the same model as compiled blocks (`tree_lstm_blocks`), and 'as a user writes "
        "them' as a block per step (`user_blocks.py`). Record us/node: recording time per "
        "graph node.\n\n" + markdown_table(head, table) + ("\n\n" + notes if notes else "\n")
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Run, print, and write JSON and markdown under benchmarks/results/."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="random and SST trees, batch 32, 256")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--no-peers", action="store_true", help="leave DyNet and DGL out")
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, help="default per --quick")
    parser.add_argument("--batch-sizes", type=int, nargs="+", help="default per --quick")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for JSON and markdown")
    args = parser.parse_args(argv)
    results = run(args.quick, args.threads, not args.no_peers, args.workloads, args.batch_sizes)
    results["quick"] = args.quick
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "treelstm-quick" if args.quick else "treelstm"
    (args.out / f"{stem}.json").write_text(json.dumps(results, indent=1))
    (args.out / f"{stem}.md").write_text(summary(results))
    print(summary(results))


if __name__ == "__main__":
    main()
