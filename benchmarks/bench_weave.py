"""Weave graph convolutions on ESOL: one molecule at a time, batchfold's front ends, peers.

The model is :class:`~batchfold.models.weave.WeaveModel` (Kearnes et al. 2016) with the
defaults of ``batchfold train esol``: atom and pair states 50, 2 weave modules, a 128-wide
``tanh`` layer summed over the atoms, an MLP with 128 hidden units, one output. The inputs are
ESOL molecules (every ordered atom pair, as Kearnes et al.), the target each molecule's
standardised log solubility, the loss the summed squared error. All systems run the same
weights on the same batches:

- **one at a time (PyTorch loop)**: ``weave_predict`` on each molecule, eager, the
  predictions stacked;
- **batchfold blocks**: the model written as blocks (``weave_blocks``), compiled with the
  agenda scheduler;
- **batchfold batch_map**: the same per-molecule code as the loop, ``weave_predict``, through
  ``batchfold.batch_map`` (agenda);
- **dgllife**: the same model on DGL-LifeSci's Weave layers (``peers/dgllife_weave.py``, in
  ``benchmarks/.peers/dgl``), one DGL graph per molecule with an edge per atom pair, batched
  with ``dgl.batch`` inside the timed step ("batching in the step") or beforehand ("graphs
  batched beforehand"). That script's docstring says how dgllife's Weave layer differs from
  batchfold's and how the peer is made to compute the same function.
- **pyg**: the same model written in PyTorch Geometric (``peers/pyg_weave.py``, in
  ``benchmarks/.peers/pyg``) with batchfold's parameter names, one ``Data`` per molecule with
  an edge per atom pair, batched with ``Batch.from_data_list`` in the step or beforehand.

The peers' files and runs are in ``weave_peers.py``. Before timing, the batchfold systems'
loss and gradients are checked against the loop's in float64 on 4 molecules, and each peer's
loss on 16 molecules at the shared initial weights, and again after one SGD step, against the
loop's (the report's notes give the verdict; a peer that cannot run is named there and left
out).

Each batch size (64 and 256) and mode (training: forward, loss, backward and an SGD step;
inference: forward and loss under ``no_grad``) runs passes over the same molecules, every
batch once per pass: one untimed warm-up round, then timed rounds (3; 2 with ``--quick``; ``--rounds N``).
In each round every system, the peers included, runs one pass, in an order that rotates from
round to round: the peers' scripts stay loaded and wait for their turn
(``weave_peers.start_peers``), so a slow minute of this shared machine weighs on every system
alike instead of on the one whose block it fell in. Throughput is molecules per pass / the
median pass. batchfold rows also give the record / schedule / execute split of a step.
batchfold's systems put the weights back after every training pass; the peers train on from
theirs, which at the timing rate (``LR``) barely move.

    python benchmarks/bench_weave.py            # 512 molecules per pass
    python benchmarks/bench_weave.py --quick    # 256 molecules per pass, 2 timed passes

Writes ``benchmarks/results/weave[-quick].json`` and ``.md``. Without the ESOL data
(``shared/data/esol``, see ``batchfold.data.molecules.load_esol``) it says so and stops.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import random
import tempfile
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

import batchfold as bf
from baselines import loss_and_grads, split_fields, time_inference, time_training
from batchfold import blocks
from batchfold.data.molecules import Molecule, load_esol
from batchfold.models.weave import WeaveModel, weave_predict
from batchfold.models.weave_blocks import weave_blocks
from machine import describe_machine, markdown_table, spread, write_results
from memory import PeakMemory
from weave_peers import (
    PEERS,
    PeerPasses,
    check_peers,
    measure_in_turns,
    start_peers,
    write_molecules,
    write_weights,
)

RESULTS = Path(__file__).resolve().parent / "results"
CONFIG = {
    "n_tasks": 1,
    "atom_dim": 50,
    "pair_dim": 50,
    "n_modules": 2,
    "gather_dim": 128,
    "hidden": 128,
    "gather": "sum",
}
"""The model: ``batchfold train esol``'s defaults."""
LR = 1e-6
"""The SGD learning rate of the timed steps: the loss is a sum over the batch, and at 1e-4
training diverges within a few steps of 256 molecules (to inf, where the timing means
nothing); batchfold's systems put the weights back after every training pass anyway."""
CHECK_LR = 1e-4
"""The learning rate of the step after which the peers' loss is checked again: large enough
that a peer whose gradients differ from batchfold's (say, with dgllife's two A->P blocks of
the pair update trained apart) shows it at a relative tolerance of 1e-4."""
LOOP = "one at a time (PyTorch loop)"
Runner = Callable[[Sequence[Any]], Tensor]
"""The summed squared error of a batch of molecules."""


def squared_error(predictions: Tensor, batch: Sequence[Molecule]) -> Tensor:
    """The summed squared error of predictions ``[n, n_tasks]`` against the molecules' labels."""
    labels = torch.stack([m.label for m in batch]).to(predictions)
    return (predictions - labels).pow(2).sum()


def loop_loss(model: WeaveModel, batch: Sequence[Molecule]) -> Tensor:
    """A batch's loss, one molecule at a time in plain PyTorch."""
    return squared_error(torch.stack([weave_predict(model, m) for m in batch]), batch)


class BatchMapRunner:
    """A batch's loss through ``batch_map`` on ``weave_predict``; keeps every call's stats."""

    def __init__(self, model: WeaveModel) -> None:
        self.model = model
        self.stats: list[bf.Stats] = []

    def __call__(self, batch: Sequence[Molecule]) -> Tensor:
        predictions, stats = bf.batch_map(
            partial(weave_predict, self.model), batch, scheduler="agenda", return_stats=True
        )
        self.stats.append(stats)
        return squared_error(torch.stack(predictions), batch)


class BlocksRunner:
    """A batch's loss through the compiled ``weave_blocks``; keeps every call's stats.

    The compiled model uses ``model``'s own modules, so it shares their weights.
    """

    def __init__(self, model: WeaveModel) -> None:
        self.compiled = blocks.compile(weave_blocks(model), scheduler="agenda")
        self.stats: list[bf.Stats] = []

    def __call__(self, batch: Sequence[Molecule]) -> Tensor:
        predictions, _ = self.compiled(list(batch))
        assert self.compiled.last_stats is not None
        self.stats.append(self.compiled.last_stats)
        return squared_error(predictions, batch)


def make_systems(model: WeaveModel) -> dict[str, Runner]:
    """The in-process systems on one model: the loop first."""
    return {
        LOOP: partial(loop_loss, model),
        "batchfold blocks": BlocksRunner(model),
        "batchfold batch_map": BatchMapRunner(model),
    }


def check_systems(model: WeaveModel, molecules: Sequence[Molecule]) -> None:
    """Every batchfold system's loss and gradients equal the loop's on ``molecules``.

    Arguments:
        model: the model, best in float64.
        molecules: a few molecules with labels.

    Raises:
        RuntimeError: a system disagrees; the message names it.
    """
    systems = make_systems(model)
    expected = loss_and_grads(LOOP, systems.pop(LOOP), model, molecules)
    for name, runner in systems.items():
        got = loss_and_grads(name, runner, model, molecules)
        for what, a, b in zip(
            ["loss", *dict(model.named_parameters())], got, expected, strict=True
        ):
            if not torch.allclose(a, b, rtol=1e-9, atol=1e-12):
                raise RuntimeError(f"{name}: the {what} differs from the loop's")


def standardised(molecules: Sequence[Molecule]) -> list[Molecule]:
    """The molecules with their labels standardised by the set's mean and standard deviation."""
    labels = torch.stack([m.label for m in molecules]).double()
    mean, std = labels.mean(), labels.std()
    return [
        dataclasses.replace(m, label=((m.label.double() - mean) / std).float()) for m in molecules
    ]


def check_peer_losses(
    model: WeaveModel, molecules: Sequence[Molecule], scratch: Path
) -> tuple[list[str], set[str]]:
    """The peers' loss on ``molecules`` from the model's weights, before and after one SGD step.

    Both are compared with the loop's (in float32, as the peers run); the step, at
    :data:`CHECK_LR` on all the molecules, shows that a peer's gradients are batchfold's.
    Returns the notes and the peers that ran (:func:`weave_peers.check_peers`).
    """
    weights = write_weights(model, scratch / "check-weights.npz")
    path = write_molecules(molecules, scratch / "check.npz")
    stepped = copy.deepcopy(model)
    sgd = torch.optim.SGD(stepped.parameters(), lr=CHECK_LR)
    loop_loss(stepped, molecules).backward()
    sgd.step()
    with torch.no_grad():
        before, after = float(loop_loss(model, molecules)), float(loop_loss(stepped, molecules))
    return check_peers(path, weights, (before, after), len(molecules), CHECK_LR)


# ----------------------------------------------------------------------------------------------
# timing


def batchfold_pass(
    runner: Runner, model: WeaveModel, batches: list[list[Any]], training: bool
) -> tuple[float, dict[str, Any]]:
    """Seconds of one pass of an in-process system over ``batches``, and its peak memory.

    The steps are timed one by one (``baselines.time_training`` / ``time_inference``, which
    put the weights back after training) and added up.
    """
    with PeakMemory() as peak:
        if training:
            sgd = torch.optim.SGD(model.parameters(), lr=LR)
            timing = time_training(runner, batches, sgd, 0, len(batches))
        else:
            timing = time_inference(runner, batches, 0, len(batches))
    return sum(timing.times), peak.as_dict()


def run(
    quick: bool,
    threads: int,
    peers: bool,
    sizes: Sequence[int] = (64, 256),
    rounds: int | None = None,
) -> dict[str, Any] | None:
    """Check, then measure every configuration; the JSON-ready results (None without ESOL).

    Arguments:
        quick: 256 molecules per pass and 2 timed passes (else 512 and 3).
        threads: torch intra-op threads (the peer gets as many).
        peers: run the peers (dgllife, pyg) too.
        sizes: the batch sizes.
        rounds: timed rounds, for a longer run on a noisy machine (default: 2 or 3, as above).
    """
    torch.set_num_threads(threads)
    try:
        data = load_esol(None)
    except FileNotFoundError as error:
        print(f"bench_weave: skipped, the ESOL data is missing: {error}")
        return None
    molecules = standardised(list(data))
    random.Random(0).shuffle(molecules)
    per_pass = 256 if quick else 512
    if any(per_pass % size for size in sizes) or per_pass > len(molecules):
        raise ValueError(f"every batch size must divide {per_pass} molecules per pass")
    passes = (1, rounds or (2 if quick else 3))
    notes = [f"{len(molecules)} ESOL molecules, the first {per_pass} of a fixed shuffle timed"]

    torch.manual_seed(0)
    check_systems(WeaveModel(**CONFIG).double(), molecules[:4])
    notes.append("batchfold blocks and batch_map: loss and gradients equal the loop's (float64)")
    torch.manual_seed(0)
    model = WeaveModel(**CONFIG)
    systems = make_systems(model)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as scratch_dir, ExitStack() as stack:
        scratch = Path(scratch_dir)
        peer_passes: dict[str, PeerPasses] = {}
        if peers:
            peer_notes, ran = check_peer_losses(model, molecules[:16], scratch)
            notes += peer_notes
            if ran:
                files = (
                    write_molecules(molecules[:per_pass], scratch / "molecules.npz"),
                    write_weights(model, scratch / "weights.npz"),
                )
                peer_passes, peer_notes = start_peers(files, threads, LR, ran, stack)
                notes += peer_notes
        for size in sizes:
            batches = [molecules[i : i + size] for i in range(0, per_pass, size)]
            for mode in ("training", "inference"):
                training = mode == "training"
                turn: dict[str, Callable[[], tuple[float, dict[str, Any]]]] = {
                    name: partial(batchfold_pass, runner, model, batches, training)
                    for name, runner in systems.items()
                }
                turn |= {name: partial(p, size, training) for name, p in peer_passes.items()}
                for runner in systems.values():
                    if isinstance(runner, BatchMapRunner | BlocksRunner):
                        runner.stats.clear()
                timed = measure_in_turns(turn, passes[1], per_pass, size, notes)
                for name in [name for name in peer_passes if name not in timed]:
                    del peer_passes[name]  # it stopped: no turn in later configurations
                for name, fields in timed.items():
                    row = {"mode": mode, "batch_size": size, "system": name} | fields
                    runner = systems.get(name)
                    if isinstance(runner, BatchMapRunner | BlocksRunner):
                        row.update(split_fields(runner.stats[len(batches) :]))  # after warm-up
                    if name in peer_passes:
                        ready = peer_passes[name].server.ready
                        row.update(version=ready.get("version"), threads=ready.get("threads"))
                    rows.append(row)
                    print(format_row(row), flush=True)
    return {
        "benchmark": "weave",
        "machine": describe_machine(threads),
        "model": CONFIG,
        "lr": LR,
        "passes": {"warmup": passes[0], "timed": passes[1], "molecules": per_pass},
        "rows": rows,
        "notes": notes,
        "quick": quick,
    }


# ----------------------------------------------------------------------------------------------
# reporting


def split_ms(row: dict[str, Any]) -> str:
    """batchfold's record / schedule / execute milliseconds per step; "" for other systems."""
    if "record_s" not in row:
        return ""
    return " / ".join(f"{1e3 * row[k]:.0f}" for k in ("record_s", "schedule_s", "execute_s"))


def format_row(row: dict[str, Any]) -> str:
    """A progress line."""
    return (
        f"{row['mode']:>9s} b={row['batch_size']:<4d} {row['system']:<36s} "
        f"{row['molecules_per_s']:9.1f} molecules/s  peak {row['peak_mb']:7.1f} MB"
        + (f"  record/schedule/execute {split_ms(row)} ms" if "record_s" in row else "")
    )


def fastest_peer(rows: Sequence[dict[str, Any]], mode: str, size: int) -> dict[str, Any] | None:
    """The fastest peer row (any peer, any batching) of a mode and batch size, if any ran."""
    return max(
        (r for r in rows if (r["mode"], r["batch_size"]) == (mode, size) and r["system"] in PEERS),
        key=lambda r: r["molecules_per_s"],
        default=None,
    )


def summary(results: dict[str, Any]) -> str:
    """The markdown report: throughput, ratios to the loop and to the fastest peer, memory."""
    rows = results["rows"]
    table = []
    fastest: dict[tuple[str, int], str] = {}  # (mode, batch): the fastest peer's line
    for r in rows:
        same = [x for x in rows if (x["mode"], x["batch_size"]) == (r["mode"], r["batch_size"])]
        loop = next((x for x in same if x["system"] == LOOP), None)
        peer = fastest_peer(rows, r["mode"], r["batch_size"])
        if peer is not None:
            fastest[r["mode"], r["batch_size"]] = (
                f"{r['mode']} b={r['batch_size']}: {peer['system']} "
                f"({peer['molecules_per_s']:.1f} molecules/s)"
            )
        table.append(
            [
                r["mode"],
                r["batch_size"],
                r["system"],
                f"{r['molecules_per_s']:.1f}",
                spread(r),
                f"{r['molecules_per_s'] / loop['molecules_per_s']:.2f}x" if loop else "",
                f"{r['molecules_per_s'] / peer['molecules_per_s']:.2f}x" if peer else "",
                f"{r['peak_mb']:.0f}",
                split_ms(r),
            ]
        )
    head = [
        "mode",
        "batch",
        "system",
        "molecules/s",
        "spread",
        "vs loop",
        "vs fastest peer",
        "peak MB",
        "record / schedule / execute ms per step",
    ]
    m, p = results["machine"], results["passes"]
    versions = sorted({r["version"] for r in rows if "version" in r})
    notes = "".join(f"- {note}\n" for note in results["notes"])
    if fastest:
        notes = f"- the fastest peer: {'; '.join(fastest.values())}\n" + notes
    return (
        f"# Weave on ESOL\n\n{m['cpu']}, {m['cpus']} CPUs, {m['threads']} threads, "
        f"torch {m['torch']}, batchfold {m['batchfold']}"
        + "".join(f"; {v}" for v in versions)
        + f", commit {m['commit']}, {m['date']}\n\n"
        "Weave model of `batchfold train esol` (atom and pair 50, 2 modules, gather 128 "
        "summed, hidden 128), every ordered atom pair, summed squared error of the "
        f"standardised log solubility. Each pass runs {p['molecules']} molecules in batches. "
        f"The systems take turns: {p['warmup']} warm-up round, then {p['timed']} timed rounds, "
        "every system one pass a round, in an order that rotates from round to round (the "
        "peers' scripts stay loaded between their passes); throughput is from the median "
        "pass. Training: "
        f"forward, loss, backward, SGD step (lr {results['lr']}); inference: forward and loss "
        "under `no_grad`. batchfold runs with the agenda scheduler. Spread: (max - min) / "
        "median of the passes. Peak: the largest rise of resident memory during one of the "
        "system's passes. "
        "vs fastest peer: against the fastest peer row (dgllife or pyg, either batching) of "
        "the same mode and batch; the notes name it.\n\n"
        + markdown_table(head, table)
        + ("\n\n" + notes if notes else "\n")
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Run, print, and write JSON and markdown under benchmarks/results/."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="256 molecules per pass, 2 passes")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument(
        "--no-peers", action="store_true", help="leave the peers (dgllife, pyg) out"
    )
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--rounds", type=int, help="timed rounds (default: 3; 2 with --quick)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for JSON and markdown")
    args = parser.parse_args(argv)
    if args.rounds is not None and args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    results = run(args.quick, args.threads, not args.no_peers, args.batch_sizes, args.rounds)
    if results is not None:
        stem = "weave-quick" if args.quick else "weave"
        write_results(args.out, stem, results, summary(results))


if __name__ == "__main__":
    main()
