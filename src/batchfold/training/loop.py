"""The generic training loop shared by every task: epochs, checkpoints, metrics and plots.

:func:`train` runs a :class:`~batchfold.training.task.Task` for a number of epochs. After
each epoch it evaluates on dev, appends a line to ``metrics.jsonl`` and saves ``last.pt``
(weights, optimizer, RNG states, config), from which ``--resume`` continues exactly;
``best.pt`` keeps the epoch with the best ``task.best_metric`` (with ``--keep last``, the last
epoch: no early stopping). Both are written atomically
with a checksum that is verified when they are read (:mod:`batchfold.training.checkpoint`).
With ``--ema``, the moving average of the weights is what dev and test evaluate and what the
checkpoints' ``model`` holds (``last.pt`` also keeps the trained weights, to resume).
At the end it plots ``curves.png``, times batched against one-at-a-time training (for an
:class:`~batchfold.training.task.EagerBaseline` task) and writes the test metrics of the
best checkpoint to ``test.json``. Last it profiles one sample batch into ``profile.json``
and writes ``report.html`` (:mod:`batchfold.training.report`).

The loop itself is here; the output folder, resuming and the checkpoint files are in
:mod:`batchfold.training.run_folder`, evaluation and the throughput comparison in
:mod:`batchfold.training.evaluation` (the public names are re-exported here).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel
from tqdm import tqdm

from batchfold.errors import ConfigError
from batchfold.training import distributed
from batchfold.training.arguments import DEFAULT_LR, add_arguments, add_eval_arguments
from batchfold.training.checkpoint import load_checkpoint, rng_state, set_rng_state
from batchfold.training.evaluation import (
    compare_throughput,
    evaluate,
    evaluate_checkpoint,
    format_metrics,
    print_summary,
)
from batchfold.training.optim import epoch_lr_scale, make_average, make_optimizer, set_epoch_lr
from batchfold.training.plot import plot_curves
from batchfold.training.report import write_report
from batchfold.training.run_folder import (
    check_resume_config,
    prepare_out,
    read_history,
    resume_advice,
    run_config,
    save_checkpoints,
    write_history,
)
from batchfold.training.sample import MAX_ITEMS, profile_batch
from batchfold.training.task import Task

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

# what a run writes into its folder besides config.json and metrics.jsonl, which it rewrites
_RUN_FILES = ("last.pt", "best.pt", "test.json", "curves.png", "profile.json", "report.html")


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


# -- one epoch --------------------------------------------------------------------------------


def _train_epoch(
    task: Task,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    items: Sequence[Any],
    args: argparse.Namespace,
    epoch: int,
    ranks: distributed.Ranks | None = None,
    average: AveragedModel | None = None,
) -> dict[str, float]:
    """One pass over the shuffled training items; returns loss, items/s and seconds.

    With several ranks, each takes its share of every batch and the gradients are summed.
    ``average`` (``--ema``) is updated after every step.
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
            if average is not None:
                average.update_parameters(model)
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


# -- the run ----------------------------------------------------------------------------------


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
    # checked before the folder is touched: a refused option must not cost the run in it
    epoch_lr_scale(args.lr_schedule, 1, args.epochs, args.min_lr_scale)
    ranks = distributed.setup(args.device)
    out = prepare_out(args.out)
    config = run_config(args)
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
    average = make_average(model, args.ema)
    evaluated = model if average is None else average.module  # what dev, best.pt and test see
    lower = bool(getattr(task, "lower_is_better", False))
    first_epoch, best, history = 1, {"epoch": 0, "value": math.inf if lower else -math.inf}, []
    if args.resume:
        file = out / "last.pt"
        if not file.is_file():
            raise ConfigError(f"--resume: no checkpoint at {file}; train without --resume first")
        state = load_checkpoint(file, args.device, advice=resume_advice(out))
        check_resume_config(state["config"], config, file)
        if state["epoch"] > args.epochs:  # it would keep the weights and rewrite the config
            raise ConfigError(
                f"--resume --epochs {args.epochs}: {file} has trained {state['epoch']} epochs "
                f"already; give --epochs {state['epoch']} or more"
            )
        model.load_state_dict(state.get("trained", state["model"]))
        if average is not None:
            average.module.load_state_dict(state["model"])
            average.n_averaged.fill_(state["averaged_steps"])
        optimizer.load_state_dict(state["optimizer"])
        saved = state.get("rng_ranks", [state["rng"]])  # one state per rank of the run
        if len(saved) == ranks.world:
            set_rng_state(saved[ranks.rank])
        else:  # another number of processes: rank 0 goes on, the others draw streams of their own
            set_rng_state(state["rng"])
            if ranks.rank:
                torch.manual_seed(args.seed + 7919 * ranks.rank + 104729 * state["epoch"])
        first_epoch, best = state["epoch"] + 1, state["best"]
        history = read_history(out / "metrics.jsonl", state["epoch"])
    elif ranks.main:  # a fresh start: what an earlier run in the folder left is not its
        left = [name for name in _RUN_FILES if (out / name).exists()]
        for name in left:  # a last.pt left would let --resume go on from that run
            (out / name).unlink()
        if left:
            print(f"{out}: a new run; removed {', '.join(left)} of an earlier run (see --resume)")
    if ranks.main:
        (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        write_history(out / "metrics.jsonl", history)
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
        record.update(_train_epoch(task, model, optimizer, items, args, epoch, ranks, average))
        if ranks.main:  # rank 0 evaluates and writes; the others wait for the next epoch
            record["dev"] = evaluate(task, evaluated, "dev")
        generators = distributed.gather_state(rng_state(), ranks)  # each rank draws its own
        if not ranks.main:
            distributed.barrier(ranks)
            continue
        history.append(record)
        with open(out / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        value = record["dev"][task.best_metric]
        better = value < best["value"] if lower else value > best["value"]
        kept = better or args.keep == "last"
        if kept:
            best = {"epoch": epoch, "value": value}
        checkpoint = {
            "model": evaluated.state_dict(),
            "optimizer": optimizer.state_dict(),
            "epoch": epoch,
            "rng": generators[0],
            "rng_ranks": generators,
            "config": config,
            "best": best,
            "dev": record["dev"],
        }
        if average is not None:  # "model" holds the average; resuming needs the weights too
            checkpoint |= {"trained": model.state_dict(), "averaged_steps": int(average.n_averaged)}
        save_checkpoints(out, checkpoint, kept)
        print(
            f"epoch {epoch}/{args.epochs}: train loss {record['train_loss']:.4f}, "
            f"{format_metrics('dev', record['dev'])}, {record['items_per_s']:.1f} {task.unit}/s, "
            f"{record['seconds']:.1f} s" + (" (best)" if better and args.keep == "best" else "")
        )
        distributed.barrier(ranks)
    if not ranks.main:
        return {}
    return _finish(task, model, items, args, history, out)


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
        summary.update(best_epoch=best["epoch"], dev=best["dev"], keep=args.keep)
    summary["test"] = evaluate(task, model, "test")
    rates = [record["items_per_s"] for record in history]
    summary["train_items_per_s"] = sum(rates) / len(rates) if rates else None
    summary["unit"] = task.unit
    summary["throughput"] = throughput
    (out / "test.json").write_text(json.dumps(summary, indent=2) + "\n")
    print_summary(summary, task.unit)
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
