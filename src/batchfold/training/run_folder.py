"""A training run's ``--out`` folder: creating it, resuming from it, the files the loop keeps.

:func:`prepare_out` makes the folder and checks that it can be written to.
:func:`check_resume_config` refuses a ``--resume`` whose options would change the numbers.
:func:`read_history` and :func:`write_history` read and write ``metrics.jsonl``;
:func:`save_checkpoints` writes ``best.pt`` and ``last.pt``
(:mod:`batchfold.training.checkpoint`).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from batchfold.errors import ConfigError
from batchfold.training.checkpoint import encode_checkpoint, write_checkpoint

__all__ = [
    "check_resume_config",
    "prepare_out",
    "read_history",
    "resume_advice",
    "run_config",
    "save_checkpoints",
    "write_history",
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
    "ema": 0.0,
    "keep": "best",
}
# options a task gained after runs were saved, with what those runs did: random word vectors
# and no tag dropout
_ADDED_LATER_BY_TASK = {
    "tagger": {"glove": "none"},
    "parser": {"glove": "none", "tag_dropout": 0.0},
    "esol": {"dropout": 0.0, "atom_counts": False},
    "tox21": {"dropout": 0.0, "atom_counts": False},
}


def as_saved(config: dict[str, Any]) -> dict[str, Any]:
    """A saved run's options, with the value it ran with for each option added since.

    Arguments:
        config: the ``config`` of a checkpoint or ``config.json``.

    Returns:
        ``config`` with the options it lacks that were added later, at the values that give
        what the run did.
    """
    task = config.get("task")
    later = _ADDED_LATER_BY_TASK.get(task, {}) if isinstance(task, str) else {}
    return {**_ADDED_LATER, **later, **config}


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


def resume_advice(out: Path) -> str:
    """What to do when ``last.pt`` in ``out`` cannot be read, for the error's message."""
    return (
        f"to go on from the best epoch, copy {out / 'best.pt'} over it and --resume again, or "
        "train again without --resume"
    )


def run_config(args: argparse.Namespace) -> dict[str, Any]:
    """The options of a run as JSON values (the command itself and its file are left out)."""
    skip = {"command", "checkpoint"}
    return {
        key: str(value) if isinstance(value, os.PathLike) else value
        for key, value in vars(args).items()
        if key not in skip
    }


def check_resume_config(saved: dict[str, Any], now: dict[str, Any], file: Path) -> None:
    """Refuse to resume from ``file`` when its options ``saved`` differ from ``now``.

    Only options that do not change the numbers may differ (``--epochs``, ``--device``,
    ``--threads``, ...; not ``--epochs`` with a learning-rate schedule).

    Raises:
        ConfigError: an option changed; the message lists each with both values.
    """
    saved = as_saved(saved)
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


def read_history(file: Path, up_to: int) -> list[dict[str, Any]]:
    """The records of ``metrics.jsonl`` up to epoch ``up_to`` (none when there is no file).

    Records are appended after each checkpoint: a last line cut short (a crash while writing)
    is an epoch after ``up_to``'s, dropped as the records after it are.
    """
    if not file.is_file():
        return []
    lines = [line for line in file.read_text().splitlines() if line.strip()]
    records = []
    for number, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as error:
            if number == len(lines):
                break
            raise ConfigError(f"{file}:{number}: not JSON ({error.msg})") from None
    return [record for record in records if record["epoch"] <= up_to]


def write_history(file: Path, history: list[dict[str, Any]]) -> None:
    """Write ``history`` to ``metrics.jsonl``, one JSON record a line, replacing the file."""
    file.write_text("".join(json.dumps(record) + "\n" for record in history))


def save_checkpoints(out: Path, checkpoint: dict[str, Any], improved: bool) -> None:
    """Write ``best.pt`` (when the epoch improved) and then ``last.pt``, each atomically.

    ``best.pt`` goes first: a crash between the two leaves ``last.pt`` at the previous epoch,
    and the resumed run redoes this epoch exactly and writes both again.
    """
    data = encode_checkpoint(checkpoint)
    if improved:
        write_checkpoint(out / "best.pt", data)
    write_checkpoint(out / "last.pt", data)
