"""The ``batchfold`` command: ``batchfold train <task>``, ``batchfold eval <task>`` and
``batchfold report RUN_DIR``.

A task is a module of :mod:`batchfold.training` with ``add_arguments(parser)`` and
``make_task(args)``; only the module of the task named on the command line is imported.
Training and evaluation themselves live in :mod:`batchfold.training.loop`, the HTML report
of a run folder in :mod:`batchfold.training.report`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import torch

from .errors import CommandLineError, ConfigError

__all__ = ["COMMANDS", "TASKS", "build_parser", "checkpoint_arguments", "main"]

TASKS = {
    "sst": "batchfold.training.sst",
    "tagger": "batchfold.training.tagger",
    "parser": "batchfold.training.parser",
    "biaffine": "batchfold.training.biaffine",
    "esol": "batchfold.training.esol",
    "tox21": "batchfold.training.tox21",
}
"""Task name -> the module that defines it (imported only when that task is run)."""

COMMANDS = {
    "train": "train a model; writes checkpoints, metrics, curves and test results to --out",
    "eval": "evaluate a saved checkpoint and print its metrics",
    "report": "write a run folder's report.html (batchfold report RUN_DIR [--out FILE])",
}
"""Command name -> what it does."""

TASK_COMMANDS = ("train", "eval")
"""The commands that take a task name."""

_USAGE = (
    "batchfold {train,eval} {" + ",".join(TASKS) + "} [options]\n"
    "       batchfold report RUN_DIR [--out FILE]"
)
_UNKNOWN = "expected one of: " + ", ".join(COMMANDS)
_RUNTIME = ("device", "threads", "max_eval", "scheduler", "checkpoint", "split")
"""Options that ``batchfold eval`` never takes from a checkpoint's config."""


def _top_help() -> str:
    commands = "\n".join(f"  {name:<8} {text}" for name, text in COMMANDS.items())
    tasks = "\n".join(f"  {name:<8} ({module})" for name, module in TASKS.items())
    return (
        f"usage: {_USAGE}\n\nTrain and evaluate batchfold models from the command line.\n\n"
        f"commands:\n{commands}\n\ntasks:\n{tasks}\n\n"
        "Run 'batchfold train <task> --help' for every option of a task."
    )


def load_task_module(task: str) -> ModuleType:
    """Import the module that defines ``task``.

    Arguments:
        task: a key of :data:`TASKS`.

    Returns:
        The module, with ``add_arguments`` and ``make_task``.

    Raises:
        CommandLineError: the task is unknown, or its module is missing or incomplete.
    """
    if task not in TASKS:
        raise CommandLineError(f"unknown task {task!r}; expected one of: {', '.join(TASKS)}")
    name = TASKS[task]
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as err:
        raise CommandLineError(
            f"the task {task!r} is not available: importing {name} failed ({err})"
        ) from err
    missing = [f for f in ("add_arguments", "make_task") if not hasattr(module, f)]
    if missing:
        raise CommandLineError(f"{name} does not define {' and '.join(missing)}")
    return module


def build_parser(command: str, task: str) -> argparse.ArgumentParser:
    """The argument parser of ``batchfold <command> <task>``.

    Arguments:
        command: ``"train"`` or ``"eval"``.
        task: a key of :data:`TASKS`.

    Returns:
        The parser; it reads the options that follow the task name.

    Raises:
        CommandLineError: unknown command or task, or a task module that cannot be loaded.

    Example:
        >>> args = build_parser("train", "sst").parse_args(["--epochs", "2", "--hidden", "8"])
        >>> args.epochs, args.hidden, args.batch_size
        (2, 8, 25)
    """
    from batchfold.training import loop

    if command not in TASK_COMMANDS:
        raise CommandLineError(f"unknown command {command!r}; expected one of: train, eval")
    module = load_task_module(task)
    if command == "train":
        description = f"Train the {task} task. Every option has a default; see below."
    else:
        description = (
            f"Evaluate a {task} checkpoint. Task options that are not given are taken from "
            "the checkpoint's config."
        )
    parser = argparse.ArgumentParser(prog=f"batchfold {command} {task}", description=description)
    if command == "train":
        loop.add_arguments(parser, task)
    else:
        loop.add_eval_arguments(parser)
    module.add_arguments(parser)
    return parser


def checkpoint_arguments(
    task: str, config: dict[str, Any], options: Sequence[str]
) -> argparse.Namespace:
    """The options of ``batchfold eval <task> *options`` for a checkpoint saved with ``config``.

    The checkpoint's config fills every option that ``options`` leaves out, except where and
    how to run (device, threads, scheduler, ``--max-eval``), which take their defaults.

    Arguments:
        task: a key of :data:`TASKS`.
        config: the checkpoint's ``config`` (the options of the run that wrote it).
        options: ``batchfold eval`` options; ``--checkpoint`` is required.

    Returns:
        The parsed options, ready for the task module's ``make_task``.
    """
    from batchfold.training.run_folder import as_saved  # the training package loads late

    parser = build_parser("eval", task)
    saved = {key: value for key, value in as_saved(config).items() if key not in _RUNTIME}
    return parser.parse_args(options, namespace=argparse.Namespace(**saved))


def _split_command(argv: Sequence[str]) -> tuple[str, str] | None:
    """The command and task at the start of ``argv``; ``None`` when help was asked for."""
    if not argv or argv[0] in ("-h", "--help"):
        return None
    command = argv[0]
    if command not in COMMANDS:
        raise CommandLineError(f"unknown command {command!r}; {_UNKNOWN}")
    if len(argv) < 2:
        raise CommandLineError(f"'batchfold {command}' needs a task: one of {', '.join(TASKS)}")
    if argv[1] in ("-h", "--help"):
        return None
    return command, argv[1]


def _check_device(device: str) -> None:
    """Refuse a ``--device`` that torch does not know or this machine does not have, before
    any data is read or checkpoint loaded."""
    try:
        found = torch.device(device)
    except RuntimeError as error:
        raise ConfigError(f"--device {device}: not a torch device ({error})") from None
    if found.type == "cuda" and (
        not torch.cuda.is_available() or (found.index or 0) >= torch.cuda.device_count()
    ):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        raise ConfigError(
            f"--device {device}: this machine has {count} CUDA device(s) that torch "
            f"{torch.__version__} can use; give --device cpu"
            + (f" or cuda:0 to cuda:{count - 1}" if count else "")
        )


def _run(command: str, task: str, options: Sequence[str]) -> int:
    from batchfold.training import loop

    parser = build_parser(command, task)
    module = load_task_module(task)
    if command == "train":
        args = parser.parse_args(options, namespace=argparse.Namespace(task=task))
        _check_device(args.device)
        _set_threads(args.threads)
        loop.prepare_out(args.out)  # before make_task reads the data: fail fast
        loop.train(module.make_task(args), args)
        return 0
    known, _ = parser.parse_known_args(options)
    _check_device(known.device)
    config = loop.load_checkpoint(known.checkpoint)["config"]
    if config.get("task", task) != task:
        raise ConfigError(
            f"{known.checkpoint} is a checkpoint of {config['task']!r}, not {task!r}: "
            f"evaluate it with 'batchfold eval {config['task']}'"
        )
    args = checkpoint_arguments(task, config, options)
    _set_threads(args.threads)
    metrics = loop.evaluate_checkpoint(
        module.make_task(args), args.checkpoint, args.split, args.device
    )
    print(f"{task} {args.split}, checkpoint {args.checkpoint}:")
    for name, value in metrics.items():
        shown = f"{value:.2f}" if abs(value) >= 1 or value == 0 else f"{value:.4f}"  # as train
        print(f"  {name.removeprefix(args.split + '_'):<14} {shown:>8}")
    return 0


def _report(options: Sequence[str]) -> int:
    """``batchfold report RUN_DIR [--out FILE]``."""
    from batchfold.training.report import write_report

    parser = argparse.ArgumentParser(
        prog="batchfold report",
        description="Write one self-contained HTML file about a run folder of batchfold "
        "train: configuration, learning curves, speed, and the plan, batch sizes, phases and "
        "profiler table of a sample batch.",
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a folder written by batchfold train")
    parser.add_argument(
        "--out", metavar="FILE", default=None, help="the HTML file (default: RUN_DIR/report.html)"
    )
    args = parser.parse_args(options)
    print(write_report(args.run_dir, args.out))
    return 0


def _set_threads(threads: int | None) -> None:
    if threads is not None:
        if threads < 1:
            raise CommandLineError(f"--threads must be at least 1, got {threads}")
        torch.set_num_threads(threads)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``batchfold`` command line.

    Arguments:
        argv: the arguments after the program name (default: ``sys.argv[1:]``).

    Returns:
        The exit status: 0 on success, 1 when data is missing, an option is wrong or a file
        cannot be read or written (a one-line message names it; set ``BATCHFOLD_DEBUG=1`` for
        the traceback), 2 for a command line that names no known command or task.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "report":
        try:
            return _report(argv[1:])
        except (OSError, ValueError) as err:
            if os.environ.get("BATCHFOLD_DEBUG"):
                raise
            print(f"batchfold report: error: {err}", file=sys.stderr)
            return 1
    try:
        split = _split_command(argv)
    except CommandLineError as err:
        print(f"usage: {_USAGE}\nbatchfold: error: {err}", file=sys.stderr)
        return 2
    if split is None:
        if len(argv) >= 2:  # "batchfold train --help": the command's help lists the tasks
            print(f"usage: batchfold {argv[0]} {{{','.join(TASKS)}}} [options]\n")
            print(f"{COMMANDS[argv[0]]}.\n\ntasks: {', '.join(TASKS)}")
        else:
            print(_top_help())
        return 0
    command, task = split
    try:
        return _run(command, task, argv[2:])
    except CommandLineError as err:
        print(f"batchfold: error: {err}", file=sys.stderr)
        return 2
    except (OSError, ValueError, FloatingPointError) as err:  # bad data, options or files;
        if os.environ.get("BATCHFOLD_DEBUG"):  # a loss that became NaN
            raise
        print(f"batchfold {command} {task}: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(
            f"batchfold {command} {task}: interrupted; a training run goes on from its last "
            "finished epoch with the same options and --resume",
            file=sys.stderr,
        )
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
