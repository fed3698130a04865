"""The generic training loop shared by every task: epochs, checkpoints, metrics and plots.

:func:`train` runs a :class:`~batchfold.training.task.Task` for a number of epochs. After
each epoch it evaluates on dev, appends a line to ``metrics.jsonl`` and saves ``last.pt``
(weights, optimizer, RNG states, config), from which ``--resume`` continues exactly;
``best.pt`` keeps the epoch with the best ``task.best_metric``. Both are written atomically
with a checksum that is verified when they are read (:mod:`batchfold.training.checkpoint`).
At the end it plots ``curves.png``, times batched against one-at-a-time training (for an
:class:`~batchfold.training.task.EagerBaseline` task) and writes the test metrics of the
best checkpoint to ``test.json``. Last it profiles one sample batch into ``profile.json``
and writes ``report.html`` (:mod:`batchfold.training.report`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from batchfold.errors import ConfigError
from batchfold.training import distributed
from batchfold.training.arguments import DEFAULT_LR, add_arguments, add_eval_arguments
from batchfold.training.checkpoint import (
    encode_checkpoint,
    load_checkpoint,
    rng_state,
    set_rng_state,
    write_checkpoint,
)
from batchfold.training.optim import make_optimizer, set_epoch_lr
from batchfold.training.plot import plot_curves
from batchfold.training.report import write_report
from batchfold.training.sample import MAX_ITEMS, profile_batch
from batchfold.training.task import EagerBaseline, Task

__all__ = [
    "DEFAULT_LR",
    "ConfigError",
    "add_arguments",
    "add_eval_arguments",
    "compare_throughput",
    "evaluate_checkpoint",
    "load_checkpoint",
    "prepare_out",
    "shuffled_batches",
    "train",
]

# Options that may differ between a run and its --resume: they do not change the numbers.
_FREE_ON_RESUME = frozenset(
    {"epochs", "resume", "device", "threads", "out", "compare_batches", "progress"}
    | {"glove_words"}  # what the SST task found in the GloVe file, not an option
    | {"predicted_tags_upos"}  # the parser's tagger accuracy, measured (may vary by device)
)
# Options added after runs were saved: a checkpoint without them ran with these values.
_ADDED_LATER = {
    "lr_schedule": "constant",
    "min_lr_scale": 0.0,
    "weight_decay": 0.0,
}


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and PyTorch's global generators.

    Arguments:
        seed: the seed.
    """
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def shuffled_batches(n_items: int, batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """The item indices of each batch of one epoch, in a shuffled order.

    The order depends only on ``seed`` and ``epoch``, so a resumed run sees the same batches.

    Arguments:
        n_items: the number of training items.
        batch_size: items per batch (the last batch may be smaller).
        seed: the run's seed.
        epoch: the epoch, from 1.

    Returns:
        Lists of indices that together cover ``range(n_items)`` once.

    Example:
        >>> b = shuffled_batches(5, 2, seed=0, epoch=1)
        >>> [len(x) for x in b], sorted(i for x in b for i in x)
        ([2, 2, 1], [0, 1, 2, 3, 4])
    """
    if batch_size < 1:
        raise ConfigError(f"--batch-size must be at least 1, got {batch_size}")
    order = np.random.default_rng([seed, epoch]).permutation(n_items).tolist()
    return [order[i : i + batch_size] for i in range(0, n_items, batch_size)]


# -- the output folder and resuming -----------------------------------------------------------


def prepare_out(out: str | os.PathLike[str]) -> Path:
    """Create the ``--out`` folder if needed and check that files can be written in it.

    Arguments:
        out: the folder.

    Returns:
        The folder as a path.

    Raises:
        ConfigError: the folder cannot be created (a file is in the way, a read-only parent)
            or written to; the one-line message names the folder.
    """
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"--out {folder} is a file, not a folder; choose another --out")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder, prefix=".batchfold-write-test-"):
            pass
    except OSError as err:
        reason = "a file is in its path" if isinstance(err, NotADirectoryError) else err.strerror
        raise ConfigError(
            f"--out {folder}: cannot create or write to this folder ({reason or err}); choose "
            "a folder you can write to"
        ) from err
    return folder


def _resume_advice(out: Path) -> str:
    return (
        f"to go on from the best epoch, copy {out / 'best.pt'} over it and --resume again, or "
        "train again without --resume"
    )


def _config(args: argparse.Namespace) -> dict[str, Any]:
    """The options of a run as JSON values (the command itself and its file are left out)."""
    skip = {"command", "checkpoint"}
    return {
        key: str(value) if isinstance(value, os.PathLike) else value
        for key, value in vars(args).items()
        if key not in skip
    }


def _check_resume_config(saved: dict[str, Any], now: dict[str, Any], file: Path) -> None:
    saved = {**_ADDED_LATER, **saved}
    free = (
        _FREE_ON_RESUME - {"epochs"}
        if now.get("lr_schedule", "constant") != "constant"
        else _FREE_ON_RESUME
    )
    changed = [
        key
        for key in sorted(saved.keys() | now.keys())
        if key not in free and saved.get(key) != now.get(key)
    ]
    if changed:
        detail = ", ".join(f"{k}: {saved.get(k)!r} -> {now.get(k)!r}" for k in changed)
        raise ConfigError(
            f"--resume from {file} with different options ({detail}). Resume with the options "
            "of the first run (only --epochs, --device, --threads may change; not --epochs with "
            "a learning-rate schedule, which depends on it), or start a new "
            "run in another --out folder."
        )


# -- one epoch --------------------------------------------------------------------------------


def _train_epoch(
    task: Task,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    items: Sequence[Any],
    args: argparse.Namespace,
    epoch: int,
    ranks: distributed.Ranks | None = None,
) -> dict[str, float]:
    """One pass over the shuffled training items; returns loss, items/s and seconds.

    With several ranks, each takes its share of every batch and the gradients are summed.
    """
    ranks = ranks or distributed.Ranks()
    model.train()
    batches = shuffled_batches(len(items), args.batch_size, args.seed, epoch)
    total_loss, total_terms = 0.0, 0
    start = time.perf_counter()
    with tqdm(
        total=len(items),
        desc=f"epoch {epoch}/{args.epochs}",
        unit=f" {task.unit}",
        disable=_progress_disabled(args) if ranks.main else True,
        leave=False,
        dynamic_ncols=True,
    ) as bar:
        for number, indices in enumerate(batches, 1):
            optimizer.zero_grad(set_to_none=True)
            share = ranks.share(indices) if ranks.world > 1 else indices
            value, terms = 0.0, 0
            if share:
                loss, terms = task.loss(model, [items[i] for i in share])
                loss.backward()
                value = loss.item()
            distributed.sum_gradients(model, ranks)
            if ranks.world > 1:
                value, summed = distributed.sum_values([value, terms], ranks)
                terms = int(summed)
            if not math.isfinite(value):
                raise FloatingPointError(
                    f"the {task.name} loss is {value} at epoch {epoch}, batch {number}; try a "
                    "lower --lr"
                )
            optimizer.step()
            total_loss += value
            total_terms += terms
            bar.update(len(indices))
            bar.set_postfix(loss=f"{total_loss / max(total_terms, 1):.4f}", refresh=False)
    seconds = time.perf_counter() - start
    return {
        "train_loss": total_loss / max(total_terms, 1),
        "items_per_s": len(items) / seconds,
        "seconds": seconds,
    }


def _progress_disabled(args: argparse.Namespace) -> bool | None:
    progress = getattr(args, "progress", None)
    return None if progress is None else not progress  # None: tqdm shows it on a terminal


def _evaluate(task: Task, model: nn.Module, split: str) -> dict[str, float]:
    model.eval()
    try:
        with torch.no_grad():
            return task.evaluate(model, split)
    finally:
        model.train()


def _format_metrics(split: str, metrics: dict[str, float]) -> str:
    """``"dev upos 95.12, ..."``: keys that start with the split's name print without it."""
    # percentages read best with 2 decimals, fractions with 4
    return f"{split} " + ", ".join(
        f"{key.removeprefix(split + '_')} "
        + (f"{value:.2f}" if abs(value) >= 1 or value == 0 else f"{value:.4f}")
        for key, value in metrics.items()
    )


# -- throughput -------------------------------------------------------------------------------


def compare_throughput(
    task: Task, model: nn.Module, items: Sequence[Any], batch_size: int, n_batches: int
) -> dict[str, float] | None:
    """Time forward and backward of a few batches batched and one item at a time.

    Both run on the same batches and weights, in train mode; the RNG state is restored after,
    and no optimizer step is taken, so training is unaffected.

    Arguments:
        task: the task; it must be an :class:`EagerBaseline` for a comparison.
        model: the model.
        items: the training items; the first ``n_batches * batch_size`` are used.
        batch_size: items per batch.
        n_batches: how many batches to time.

    Returns:
        ``batched_per_s``, ``one_at_a_time_per_s``, ``speedup`` and ``items``, or ``None``
        when the task has no eager baseline or ``n_batches`` is 0.
    """
    if n_batches <= 0 or not isinstance(task, EagerBaseline) or not items:
        return None
    batches = [
        list(items[i : i + batch_size])
        for i in range(0, min(len(items), n_batches * batch_size), batch_size)
    ]
    model.train()
    seconds = {"batched": 0.0, "eager": 0.0}
    with torch.random.fork_rng(devices=[]):
        for batch in batches:
            for kind, loss_fn in (("batched", task.loss), ("eager", task.eager_loss)):
                model.zero_grad(set_to_none=True)
                start = time.perf_counter()
                loss, _ = loss_fn(model, batch)
                loss.backward()
                _synchronize(loss.device)
                seconds[kind] += time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    n = sum(len(b) for b in batches)
    return {
        "items": n,
        "batched_per_s": n / seconds["batched"],
        "one_at_a_time_per_s": n / seconds["eager"],
        "speedup": seconds["eager"] / seconds["batched"],
    }


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":  # CUDA work is asynchronous: wait for it before reading a clock
        torch.cuda.synchronize(device)


# -- the run ----------------------------------------------------------------------------------


def _read_history(file: Path, up_to: int) -> list[dict[str, Any]]:
    if not file.is_file():
        return []
    lines = [json.loads(line) for line in file.read_text().splitlines() if line.strip()]
    return [record for record in lines if record["epoch"] <= up_to]


def _write_history(file: Path, history: list[dict[str, Any]]) -> None:
    file.write_text("".join(json.dumps(record) + "\n" for record in history))


def train(task: Task, args: argparse.Namespace) -> dict[str, Any]:
    """Train ``task`` with the loop's options in ``args`` (see :func:`add_arguments`).

    Arguments:
        task: the job.
        args: the parsed options, the loop's and the task's.

    Returns:
        The summary also written to ``test.json``: ``best_epoch``, ``dev`` (its dev
        metrics), ``test``, ``train_items_per_s`` and ``throughput`` (or ``None``).

    Raises:
        ConfigError: ``--resume`` without a checkpoint or with changed options, or a bad option.
        FloatingPointError: the loss became NaN or infinite.
    """
    if args.lr is None:
        args.lr = DEFAULT_LR[args.optimizer]
    if args.epochs < 0:
        raise ConfigError(f"--epochs must be at least 0, got {args.epochs}")
    ranks = distributed.setup(args.device)
    out = prepare_out(args.out)
    config = _config(args)
    items = task.train_items()
    if args.max_train is not None:
        items = items[: args.max_train]
    seed_everything(args.seed)
    model = task.build_model().to(args.device)  # the same initial weights on every rank
    if ranks.world > 1:
        torch.manual_seed(args.seed + 7919 * ranks.rank)  # each rank draws its own dropout
    optimizer = make_optimizer(
        args.optimizer, task.param_groups(model, args.lr), args.lr, args.weight_decay
    )
    lower = bool(getattr(task, "lower_is_better", False))
    first_epoch, best, history = 1, {"epoch": 0, "value": math.inf if lower else -math.inf}, []
    if args.resume:
        file = out / "last.pt"
        if not file.is_file():
            raise ConfigError(f"--resume: no checkpoint at {file}; train without --resume first")
        state = load_checkpoint(file, args.device, advice=_resume_advice(out))
        _check_resume_config(state["config"], config, file)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        set_rng_state(state["rng"])
        first_epoch, best = state["epoch"] + 1, state["best"]
        history = _read_history(out / "metrics.jsonl", state["epoch"])
    elif ranks.main:
        (out / "best.pt").unlink(missing_ok=True)  # from an earlier run in the same folder
    if ranks.main:
        (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        _write_history(out / "metrics.jsonl", history)
        processes = f", {ranks.world} processes" if ranks.world > 1 else ""
        print(
            f"{task.name}: {len(items)} training {task.unit}, epochs {first_epoch}-{args.epochs}"
            + processes
        )
    for epoch in range(first_epoch, args.epochs + 1):
        record: dict[str, Any] = {"epoch": epoch}
        scale = set_epoch_lr(optimizer, args.lr_schedule, epoch, args.epochs, args.min_lr_scale)
        if args.lr_schedule != "constant":
            record["lr_scale"] = scale
        record.update(_train_epoch(task, model, optimizer, items, args, epoch, ranks))
        if not ranks.main:  # rank 0 evaluates and writes; the others wait for the next epoch
            distributed.barrier(ranks)
            continue
        record["dev"] = _evaluate(task, model, "dev")
        history.append(record)
        with open(out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        value = record["dev"][task.best_metric]
        improved = value < best["value"] if lower else value > best["value"]
        if improved:
            best = {"epoch": epoch, "value": value}
        checkpoint = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "epoch": epoch,
            "rng": rng_state(),
            "config": config,
            "best": best,
            "dev": record["dev"],
        }
        _save_checkpoints(out, checkpoint, improved)
        print(
            f"epoch {epoch}/{args.epochs}: train loss {record['train_loss']:.4f}, "
            f"{_format_metrics('dev', record['dev'])}, {record['items_per_s']:.1f} {task.unit}/s, "
            f"{record['seconds']:.1f} s" + (" (best)" if improved else "")
        )
        distributed.barrier(ranks)
    if not ranks.main:
        return {}
    return _finish(task, model, items, args, history, out)


def _save_checkpoints(out: Path, checkpoint: dict[str, Any], improved: bool) -> None:
    """Write ``best.pt`` (when the epoch improved) and then ``last.pt``, each atomically.

    ``best.pt`` goes first: a crash between the two leaves ``last.pt`` at the previous epoch,
    and the resumed run redoes this epoch exactly and writes both again.
    """
    data = encode_checkpoint(checkpoint)
    if improved:
        write_checkpoint(out / "best.pt", data)
    write_checkpoint(out / "last.pt", data)


def _finish(
    task: Task,
    model: nn.Module,
    items: Sequence[Any],
    args: argparse.Namespace,
    history: list[dict[str, Any]],
    out: Path,
) -> dict[str, Any]:
    """Plot, compare throughput, test the best checkpoint and write ``test.json``."""
    if history:
        plot_curves(history, out / "curves.png", title=f"{task.name}: learning curves")
    throughput = compare_throughput(task, model, items, args.batch_size, args.compare_batches)
    summary: dict[str, Any] = {"task": task.name, "best_epoch": None, "dev": None}
    if (out / "best.pt").is_file():
        best = load_checkpoint(out / "best.pt", args.device)
        model.load_state_dict(best["model"])
        summary.update(best_epoch=best["epoch"], dev=best["dev"])
    summary["test"] = _evaluate(task, model, "test")
    rates = [record["items_per_s"] for record in history]
    summary["train_items_per_s"] = sum(rates) / len(rates) if rates else None
    summary["unit"] = task.unit
    summary["throughput"] = throughput
    (out / "test.json").write_text(json.dumps(summary, indent=2) + "\n")
    _print_summary(summary, task.unit)
    _write_profile_and_report(task, model, items, args, out)
    return summary


def _write_profile_and_report(
    task: Task, model: nn.Module, items: Sequence[Any], args: argparse.Namespace, out: Path
) -> None:
    """Profile the first training batch into ``profile.json``, then write ``report.html``.

    The run's results are already saved: a failure here is reported on stderr, not raised.
    """
    try:
        if items:
            first = shuffled_batches(len(items), args.batch_size, args.seed, 1)[0]
            sample = profile_batch(task, model, [items[i] for i in first[:MAX_ITEMS]])
            (out / "profile.json").write_text(json.dumps(sample, indent=1) + "\n")
        print(f"report: {write_report(out)}")
    except Exception as err:  # noqa: BLE001 -- the run itself has succeeded
        if os.environ.get("BATCHFOLD_DEBUG"):
            raise
        print(f"batchfold: could not write the report: {err!r}", file=sys.stderr)


def _print_summary(summary: dict[str, Any], unit: str) -> None:
    if summary["best_epoch"] is not None:
        print(f"best epoch {summary['best_epoch']}: {_format_metrics('dev', summary['dev'])}")
    print(_format_metrics("test", summary["test"]))
    if summary["train_items_per_s"] is not None:
        print(f"training: {summary['train_items_per_s']:.1f} {unit}/s (mean over epochs)")
    speed = summary["throughput"]
    if speed is not None:
        print(
            f"forward+backward on {speed['items']} {unit}: batched {speed['batched_per_s']:.1f} "
            f"{unit}/s, one at a time {speed['one_at_a_time_per_s']:.1f} {unit}/s, "
            f"speedup {speed['speedup']:.1f}x"
        )


def evaluate_checkpoint(
    task: Task, path: str | os.PathLike[str], split: str, device: str = "cpu"
) -> dict[str, float]:
    """The metrics of a saved checkpoint on one split.

    Arguments:
        task: the job, made with the checkpoint's options.
        path: a ``best.pt`` or ``last.pt``.
        split: ``"dev"`` or ``"test"``.
        device: where the model runs.

    Returns:
        The task's metrics.
    """
    state = load_checkpoint(path, device)
    model = task.build_model().to(device)
    model.load_state_dict(state["model"])
    return _evaluate(task, model, split)
