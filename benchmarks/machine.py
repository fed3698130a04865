"""What a benchmark ran on, and a markdown table writer shared by the benchmark scripts."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import torch

import batchfold


def cpu_model() -> str:
    """The processor's model name (Linux), or what ``platform`` knows."""
    info = Path("/proc/cpuinfo")
    if info.exists():
        for line in info.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def describe_machine(threads: int) -> dict[str, Any]:
    """Machine, CPU count, threads, library versions, commit and date, for a results file."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        if changed:
            commit += " (with uncommitted changes)"
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "threads": threads,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "batchfold": batchfold.__version__,
        "matplotlib": version("matplotlib"),
        "numpy": np.__version__,
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "commit": commit,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def markdown_table(head: list[str], rows: list[list[Any]]) -> str:
    """A GitHub markdown table."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)
