"""Evaluating a model and reporting a run's numbers: dev and test metrics, throughput.

:func:`evaluate` runs a task's metrics on one split, :func:`evaluate_checkpoint` on a saved
checkpoint. :func:`compare_throughput` times batched against one-at-a-time training;
:func:`format_metrics` and :func:`print_summary` print the results.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from batchfold.errors import ConfigError
from batchfold.training.checkpoint import load_checkpoint
from batchfold.training.task import EagerBaseline, Task

__all__ = [
    "compare_throughput",
    "evaluate",
    "evaluate_checkpoint",
    "format_metrics",
    "print_summary",
]


def evaluate(task: Task, model: nn.Module, split: str) -> dict[str, float]:
    """The task's metrics on ``split``, in eval mode without gradients; train mode after."""
    model.eval()
    try:
        with torch.no_grad():
            return task.evaluate(model, split)
    finally:
        model.train()


def format_metrics(split: str, metrics: dict[str, float]) -> str:
    """``"dev upos 95.12, ..."``: keys that start with the split's name print without it."""
    # percentages read best with 2 decimals, fractions with 4
    return f"{split} " + ", ".join(
        f"{key.removeprefix(split + '_')} "
        + (f"{value:.2f}" if abs(value) >= 1 or value == 0 else f"{value:.4f}")
        for key, value in metrics.items()
    )


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


def print_summary(summary: dict[str, Any], unit: str) -> None:
    """Print the summary :func:`~batchfold.training.loop.train` writes to ``test.json``."""
    if summary["best_epoch"] is not None:
        kept = "last epoch" if summary.get("keep") == "last" else "best epoch"
        print(f"{kept} {summary['best_epoch']}: {format_metrics('dev', summary['dev'])}")
    print(format_metrics("test", summary["test"]))
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
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as error:  # sizes given on the command line that the run did not use
        raise ConfigError(
            f"{path} does not fit the model these options make (leave out the size options "
            f"to take the checkpoint's own): {str(error).splitlines()[-1].strip()}"
        ) from None
    return evaluate(task, model, split)
