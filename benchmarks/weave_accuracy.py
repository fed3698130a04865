"""Accuracy on the same split: the Weave peers trained on ESOL as batchfold trained it.

The batchfold side is the committed runs ``results/esol-last-split{S}`` (``batchfold train
esol --seed S --split-seed S``: their ``config.json``, ``metrics.jsonl`` and ``test.json``). For
each split this script rebuilds that run's task from its ``config.json`` (the same random
80/10/10 split, featurisation and order), seeds as the training loop does and builds the
model, so the initial weights are the run's, and writes the train, dev and test molecules and
the weights in the peers' formats (``weave_peers.write_molecules`` / ``write_weights``). Each
peer then trains from them with batchfold's recipe (``peers/weave_io.train_to_accuracy``:
standardised targets, summed squared error, Adam at the run's rate on a cosine to 0, the run's
batch size, epochs and per-epoch shuffles, the epoch the run's ``--keep`` names tested: the
last, or that of the best dev RMSE):
PyTorch Geometric (``peers/pyg_weave_train.py``) and DGL-LifeSci
(``peers/dgllife_weave_train.py``), each in its own environment (``setup_peers.sh``).

Two checks tie the setups together: each peer's dev RMSE at the initial weights against
batchfold's (computed here with the task's own ``evaluate``), and each peer's dev RMSE after
epoch 1 against the committed run's first ``metrics.jsonl`` line.

Writes ``results/weave-accuracy.{json,md}`` (``weave-accuracy-quick`` with ``--epochs``
below the runs' own, which the committed numbers do not match).

Usage::

    python benchmarks/weave_accuracy.py [--splits 0,1,2] [--peers pyg,dgllife] [--threads 1]
        [--epochs N]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from batchfold.cli import build_parser
from batchfold.training.esol import ESOLTask
from batchfold.training.loop import seed_everything
from machine import describe_machine, markdown_table, write_results
from peer_runner import PeerUnavailable, run_peer
from weave_peers import write_molecules, write_weights

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
RUNS = HERE.parent / "results"
PEERS = {"pyg": ("pyg", "pyg_weave_train.py"), "dgllife": ("dgl", "dgllife_weave_train.py")}
"""Each peer's environment and training script."""
RECIPE = {
    "task": "esol",
    "optimizer": "adam",
    "lr_schedule": "cosine",
    "min_lr_scale": 0.0,
    "weight_decay": 0.0,
    "max_train": None,
    "max_eval": None,
    "splitter": "random",
    "max_pair_distance": None,
}
"""The run options the peers' loop implements, and the only values it accepts."""
DIFFERENCES = (
    "What is not the same: the float32 sums run in another order (PyG's `scatter`, DGL's "
    "message passing and batched matmuls against batchfold's packed blocks): the runs "
    "agree after epoch 1 to the relative difference the notes give, then drift apart as "
    "roundoff grows over the steps, which can move the best epoch; the peers batch each "
    "step's graphs inside the step (`Batch.from_data_list`, `dgl.batch`); dgllife's layer "
    "has parameters batchfold lacks (its A->P bias held at 0, its last module's pair "
    "layers), which get no gradient and no Adam step. The batchfold rates are the committed "
    "runs' own, not measured beside the peers.\n\n"
)
"""The setups' differences, for the report."""
LOOP_OPTIONS = ("out", "resume", "progress", "compare_batches")
"""Options of a run's config that do not reach the task."""


def committed_run(split: int) -> dict[str, Any]:
    """The committed run of a split: its config, test summary and per-epoch records.

    Raises:
        SystemExit: the run is missing, or trained with options the peers do not implement.
    """
    folder = RUNS / f"esol-last-split{split}"
    try:
        config = json.loads((folder / "config.json").read_text())
        summary = json.loads((folder / "test.json").read_text())
        lines = (folder / "metrics.jsonl").read_text().splitlines()
    except OSError as error:
        raise SystemExit(f"no committed run for split {split}: {error}") from error
    for key, value in RECIPE.items():
        if config.get(key) != value:
            raise SystemExit(f"{folder}/config.json: {key} is {config.get(key)!r}, not {value!r}")
    if config["split_seed"] != split:
        raise SystemExit(f"{folder}/config.json: split_seed {config['split_seed']}, not {split}")
    return {"config": config, "summary": summary, "epochs": [json.loads(x) for x in lines]}


def export_split(config: dict[str, Any], folder: Path) -> tuple[list[Path], Path, dict[str, Any]]:
    """Write a run's three splits and initial weights; also batchfold's dev metrics at them.

    The task is built from the run's options as ``batchfold train esol`` builds it, and the
    model after ``seed_everything(seed)``, as the training loop builds it.

    Returns:
        The train, dev and test files, the weights file and the dev metrics.
    """
    args = build_parser("train", "esol").parse_args([], namespace=argparse.Namespace(task="esol"))
    for key, value in config.items():
        if key not in LOOP_OPTIONS:
            setattr(args, key, value)
    task = ESOLTask(args)
    seed_everything(args.seed)
    model = task.build_model()
    files = [write_molecules(task.splits[s], folder / f"{s}.npz") for s in ("train", "dev", "test")]
    weights = write_weights(model, folder / "weights.npz")
    return files, weights, task.evaluate(model, "dev")


def run_peer_training(
    peer: str, files: list[Path], weights: Path, config: dict[str, Any], epochs: int, threads: int
) -> dict[str, Any]:
    """Train one peer; its summary line with ``history`` (the epoch lines) and the wall time."""
    env, script = PEERS[peer]
    options = ["--weights", str(weights), "--epochs", str(epochs), "--lr", str(config["lr"])]
    options += ["--batch-size", str(config["batch_size"]), "--seed", str(config["seed"])]
    options += ["--eval-batch-size", str(config["eval_batch_size"]), "--threads", str(threads)]
    options += ["--keep", config.get("keep", "best")]
    start = time.perf_counter()
    lines = run_peer(env, script, [str(f) for f in files] + options, timeout=4 * 3600)
    *history, summary = lines
    return {**summary, "history": history, "process_seconds": time.perf_counter() - start}


def batchfold_row(run: dict[str, Any], start_dev: dict[str, Any]) -> dict[str, Any]:
    """The committed run in the fields of a peer's result."""
    epochs, summary = run["epochs"], run["summary"]
    seconds = sum(e["seconds"] for e in epochs)
    return {
        "system": "batchfold",
        "best_epoch": summary["best_epoch"],
        "dev": summary["dev"],
        "test": summary["test"],
        "dev_at_start": start_dev,
        "epochs": len(epochs),
        "train_seconds": seconds,
        "front_end": run["config"]["front_end"],
        "history": epochs,
    }


def mean_sd(values: Sequence[float], digits: int = 3) -> str:
    """``mean (sd)`` with the sample standard deviation, or the value alone."""
    if len(values) < 2:
        return f"{values[0]:.{digits}f}" if values else "n/a"
    return f"{statistics.mean(values):.{digits}f} ({statistics.stdev(values):.{digits}f})"


def run(splits: list[int], peers: list[str], threads: int, epochs: int | None) -> dict[str, Any]:
    """Export every split, train every peer on it; the results (see :func:`summary`)."""
    torch.set_num_threads(threads)
    results: dict[str, Any] = {
        "machine": describe_machine(threads),
        "splits": {},
        "configs": {},
        "notes": [],
    }
    for split in splits:
        committed = committed_run(split)
        config = committed["config"]
        results["configs"][str(split)] = config
        n_epochs = config["epochs"] if epochs is None else epochs
        with tempfile.TemporaryDirectory(prefix="weave-accuracy-") as tmp:
            files, weights, start_dev = export_split(config, Path(tmp))
            rows = [batchfold_row(committed, start_dev)]
            for peer in peers:
                print(f"split {split}: training {peer}, {n_epochs} epochs", flush=True)
                try:
                    row = run_peer_training(peer, files, weights, config, n_epochs, threads)
                except PeerUnavailable as error:
                    results["notes"].append(f"split {split}: {error}")
                    continue
                print(
                    f"  best epoch {row['best_epoch']}, dev RMSE {row['dev']['rmse']:.4f}, "
                    f"test RMSE {row['test']['rmse']:.4f}, {row['run_seconds']:.0f} s",
                    flush=True,
                )
                rows.append(row)
        results["splits"][str(split)] = rows
    results["epochs"] = epochs
    return results


def parted(ours: list[dict[str, Any]], theirs: list[dict[str, Any]], tol: float = 0.01) -> str:
    """The first epoch whose dev RMSE differs by more than ``tol`` (relative), or "none"."""
    for a, b in zip(ours, theirs, strict=False):  # a quick run has fewer epochs
        if abs(b["dev"]["rmse"] - a["dev"]["rmse"]) > tol * a["dev"]["rmse"]:
            return str(a["epoch"])
    return "none"


def checks(split: str, rows: list[dict[str, Any]]) -> list[str]:
    """The notes tying a split's peers to batchfold: dev RMSE at the start and after epoch 1,
    and the first epoch where the dev RMSEs part by more than 1%."""
    ours, notes = rows[0], []
    first = ours["history"][0]["dev"]["rmse"]
    for row in rows[1:]:
        start = row["dev_at_start"]["rmse"]
        agree = math.isclose(start, ours["dev_at_start"]["rmse"], rel_tol=1e-5)
        after = row["history"][0]["dev"]["rmse"]
        notes.append(
            f"split {split}, {row['system']}: dev RMSE at the shared initial weights "
            f"{start:.6f} vs batchfold's {ours['dev_at_start']['rmse']:.6f} "
            f"({'they agree' if agree else 'THEY DIFFER'}); after epoch 1 {after:.6f} vs the "
            f"committed run's {first:.6f} (relative difference {abs(after - first) / first:.1e}); "
            f"first epoch more than 1% apart: {parted(ours['history'], row['history'])}"
        )
    return notes


def summary(results: dict[str, Any]) -> str:
    """The markdown report of :func:`run`'s results."""
    table, by_system = [], {}
    for split, rows in results["splits"].items():
        for r in rows:
            rate = r["epochs"] / r["train_seconds"]
            whole = f"{r['run_seconds'] / 60:.1f}" if "run_seconds" in r else "n/a"
            label = "batchfold (committed run)" if r["system"] == "batchfold" else r["system"]
            table.append(
                [split, label, r["best_epoch"], f"{r['dev']['rmse']:.4f}"]
                + [f"{r['test']['rmse']:.4f}", f"{r['test']['mae']:.4f}"]
                + [f"{r['history'][-1]['dev']['rmse']:.4f}", f"{rate:.2f}", whole]
            )
            by_system.setdefault(label, []).append(r)
    means = [
        [name, len(rs)]
        + [mean_sd([r[k][m] for r in rs]) for k, m in (("test", "rmse"), ("dev", "rmse"))]
        + [mean_sd([r["test"]["mae"] for r in rs]), mean_sd([r["best_epoch"] for r in rs], 1)]
        + [mean_sd([r["history"][-1]["dev"]["rmse"] for r in rs])]
        for name, rs in by_system.items()
    ]
    notes = [n for split, rows in results["splits"].items() for n in checks(split, rows)]
    notes += results["notes"]
    m = results["machine"]
    versions = sorted({r["version"] for rows in results["splits"].values() for r in rows[1:]})
    epochs, c = results["epochs"], next(iter(results["configs"].values()))
    quick = f" (peers: {epochs} epochs, not the runs' own)" if epochs else ""
    threads = f"{m['threads']} thread{'s' if m['threads'] > 1 else ''}"
    seeds = ", ".join(str(c["seed"]) for c in results["configs"].values())
    splits = ", ".join(results["configs"])
    return (
        f"# Weave on ESOL: accuracy on the same split{quick}\n\n{m['cpu']}, {m['cpus']} "
        f"vCPUs (VM), {threads}, torch {m['torch']}, batchfold {m['batchfold']}"
        + "".join(f"; {v}" for v in versions)
        + f", commit {m['commit']}, {m['date']}\n\n"
        "batchfold: the committed runs `results/esol-last-split{S}` (`batchfold train esol --seed X "
        f"--split-seed S`, X = {seeds} for S = {splits}). Each peer trains from the same "
        "initial weights on the same train/dev/test molecules with the same recipe: targets "
        "standardised with the "
        f"training mean and sd, summed squared error, Adam lr {c['lr']:g} on a cosine to 0 over "
        f"{c['epochs']} epochs, batch {c['batch_size']}, batchfold's per-epoch shuffles (the "
        "run's seed); "
        + (
            "the last epoch is tested (`--keep last`, no early stopping). "
            if c.get("keep") == "last"
            else "the epoch of the lowest dev RMSE is tested. "
        )
        + "Last-epoch dev RMSE: the last epoch's, no selection. RMSE and "
        "MAE in log mol/L. Epochs/s: training passes only "
        "(batchfold: the committed run's own timing, taken under whatever "
        "load the machine had then); run min: the whole peer run with per-epoch dev "
        "evaluation. sd: sample standard deviation over the splits.\n\n"
        + DIFFERENCES
        + markdown_table(
            ["split", "system", "epoch tested", "dev RMSE", "test RMSE", "test MAE"]
            + ["last-epoch dev RMSE", "epochs/s", "run min"],
            table,
        )
        + "\n\n"
        + markdown_table(
            ["system", "splits", "test RMSE mean (sd)", "dev RMSE mean (sd)"]
            + ["test MAE mean (sd)", "epoch tested mean (sd)", "last-epoch dev RMSE mean (sd)"],
            means,
        )
        + "\n\n"
        + "".join(f"- {n}\n" for n in notes)
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Run, print, and write JSON and markdown under benchmarks/results/."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--splits", default="0,1,2", help="split seeds of the committed runs")
    parser.add_argument("--peers", default="pyg,dgllife", help="of: pyg, dgllife")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, here and peers")
    parser.add_argument("--epochs", type=int, default=None, help="fewer epochs, a quick try")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for JSON and markdown")
    args = parser.parse_args(argv)
    peers = [p for p in args.peers.split(",") if p]
    unknown = sorted(set(peers) - set(PEERS))
    if unknown:
        parser.error(f"unknown peers {unknown}; expected some of {sorted(PEERS)}")
    splits = [int(s) for s in args.splits.split(",") if s]
    results = run(splits, peers, args.threads, args.epochs)
    stem = "weave-accuracy-quick" if args.epochs is not None else "weave-accuracy"
    write_results(args.out, stem, results, summary(results))


if __name__ == "__main__":
    main()
