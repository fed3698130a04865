"""The command-line options every ``batchfold train`` and ``batchfold eval`` run shares.

:func:`add_arguments` adds the training loop's options (epochs, batch size, optimizer,
seed, output folder, device, threads, resume...) to a task's parser, and
:func:`add_eval_arguments` those of ``batchfold eval``; each task adds its own with its
``add_arguments``.
"""

from __future__ import annotations

import argparse

__all__ = ["DEFAULT_LR", "LR_SCHEDULES", "add_arguments", "add_eval_arguments"]

DEFAULT_LR = {"adagrad": 0.05, "adam": 0.001}
"""The learning rate used when neither ``--lr`` nor the task sets one, per optimizer."""

LR_SCHEDULES = ("constant", "cosine")
"""The values of ``--lr-schedule`` (see :mod:`batchfold.training.optim`)."""


def add_arguments(parser: argparse.ArgumentParser, task_name: str) -> None:
    """Add the options every task shares (optimizer, epochs, checkpoints, ...) to ``parser``.

    Arguments:
        parser: the ``batchfold train <task>`` parser.
        task_name: the task's name, for the default output folder ``runs/<task>``.

    Example:
        >>> parser = argparse.ArgumentParser()
        >>> add_arguments(parser, "sst")
        >>> args = parser.parse_args(["--epochs", "3"])
        >>> args.epochs, args.out, args.optimizer
        (3, 'runs/sst', 'adagrad')
    """
    group = parser.add_argument_group("training (shared by all tasks)")
    group.add_argument(
        "--optimizer",
        choices=sorted(DEFAULT_LR),
        default="adagrad",
        help="the optimizer; Adagrad starts its accumulator at 0.1, as TensorFlow's "
        "(default: %(default)s)",
    )
    group.add_argument(
        "--lr",
        type=float,
        default=None,
        help="the learning rate (default: the task's, else "
        + ", ".join(f"{lr} with {name}" for name, lr in DEFAULT_LR.items())
        + ")",
    )
    group.add_argument(
        "--lr-schedule",
        choices=LR_SCHEDULES,
        default="constant",
        help="the rate over epochs: constant, or cosine (from --lr at the first epoch down to "
        "--min-lr-scale times it at the last) (default: %(default)s)",
    )
    group.add_argument(
        "--min-lr-scale",
        type=float,
        default=0.0,
        help="the cosine schedule's last rate as a share of --lr (default: %(default)s)",
    )
    group.add_argument(
        "--weight-decay",
        type=float,
        default=0.0,
        help="L2 penalty on the weights (for sst, all but the word vectors), added to the "
        "gradients (default: %(default)s)",
    )
    group.add_argument(
        "--ema",
        type=float,
        default=0.0,
        metavar="DECAY",
        help="keep an exponential moving average of the weights, updated after every step with "
        "this decay (0.999: about the last 1,000 steps), and evaluate, keep and test the "
        "average instead of the last weights; 0 for none (default: %(default)s)",
    )
    group.add_argument(
        "--keep",
        choices=("best", "last"),
        default="best",
        help="the weights kept in best.pt and tested: those of the epoch with the best dev "
        "metric, or those of the last epoch (no early stopping, as MoleculeNet's fixed-epoch "
        "runs; with a schedule that ends near 0 they have converged) (default: best; for esol, "
        "last on a random split and best on a scaffold split)",
    )
    group.add_argument(
        "--batch-size",
        type=at_least_one,
        default=32,
        help="items per batch (default: %(default)s)",
    )
    group.add_argument(
        "--epochs",
        type=int,
        default=10,
        help="passes over the training data (default: %(default)s)",
    )
    group.add_argument(
        "--seed", type=int, default=0, help="seed of every random generator (default: %(default)s)"
    )
    group.add_argument(
        "--out",
        default=f"runs/{task_name}",
        help="folder for config.json, metrics.jsonl, last.pt, best.pt, curves.png, "
        "test.json, profile.json and report.html (default: %(default)s)",
    )
    group.add_argument(
        "--resume",
        action="store_true",
        help="continue from OUT/last.pt up to --epochs, exactly as if never stopped",
    )
    group.add_argument(
        "--max-train",
        type=at_least_one,
        default=None,
        metavar="N",
        help="train on the first N training items only (default: all)",
    )
    group.add_argument(
        "--compare-batches",
        type=int,
        default=2,
        metavar="N",
        help="at the end, time N batches batched and one item at a time on the same weights, "
        "0 to skip (default: %(default)s)",
    )
    group.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show a progress bar (default: only on a terminal)",
    )
    _add_runtime_arguments(parser)


def add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``batchfold eval <task>``: the checkpoint, the split, and where to run.

    Arguments:
        parser: the ``batchfold eval <task>`` parser.

    Example:
        >>> parser = argparse.ArgumentParser()
        >>> add_eval_arguments(parser)
        >>> args = parser.parse_args(["--checkpoint", "runs/sst/best.pt"])
        >>> args.split, args.device, args.max_eval
        ('test', 'cpu', None)
    """
    group = parser.add_argument_group("evaluation")
    group.add_argument(
        "--checkpoint", required=True, metavar="PATH", help="a best.pt or last.pt written by train"
    )
    group.add_argument(
        "--split",
        choices=("dev", "test"),
        default="test",
        help="the split to evaluate on (default: %(default)s)",
    )
    _add_runtime_arguments(parser)


def at_least_one(text: str) -> int:
    """An argparse type: a whole number of at least 1 (a count of items to use).

    Example:
        >>> at_least_one("3")
        3
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1, got {value}")
    return value


def _add_runtime_arguments(parser: argparse.ArgumentParser) -> None:
    """Options that say where and how a run computes, not what it computes."""
    group = parser.add_argument_group("where and how to run (shared by all tasks)")
    group.add_argument(
        "--device", default="cpu", help="torch device, e.g. cpu or cuda (default: %(default)s)"
    )
    group.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads for PyTorch, torch.set_num_threads (default: PyTorch's choice)",
    )
    group.add_argument(
        "--max-eval",
        type=at_least_one,
        default=None,
        metavar="N",
        help="evaluate on the first N items of dev and test only (default: all; batchfold "
        "eval does not take it from the checkpoint's run)",
    )
    group.add_argument(
        "--scheduler",
        choices=("agenda", "depth"),
        default="agenda",
        help="batch_map's scheduler: agenda (DyNet) or depth (TensorFlow Fold); both give "
        "the same numbers (default: %(default)s)",
    )


# -- seeds and batches -----------------------------------------------------------------------
