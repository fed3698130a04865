"""What a benchmark ran on, and the report formatting shared by the benchmark scripts."""

from __future__ import annotations

import datetime
import json
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


def write_results(out: Path, stem: str, results: dict[str, Any], summary: str) -> None:
    """Write ``<out>/<stem>.json`` and the markdown ``summary`` as ``<stem>.md``; print it."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(results, indent=1))
    (out / f"{stem}.md").write_text(summary)
    print(summary)


def markdown_table(head: list[str], rows: list[list[Any]]) -> str:
    """A GitHub markdown table."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def spread(row: dict[str, Any]) -> str:
    """(max - min) / median of a row's timed steps, or n/a for a single one."""
    if len(row["times_s"]) < 2:
        return "n/a"
    return f"{100 * (row['max_s'] - row['min_s']) / row['median_s']:.0f}%"


def split_percent(row: dict[str, Any]) -> str:
    """batchfold's record / schedule / execute shares of a row's step, in %; "" for others."""
    if "record_s" not in row:
        return ""
    keys = ("record_s", "schedule_s", "execute_s")
    return " / ".join(f"{100 * row[k] / row['median_s']:.0f}" for k in keys)


def split_progress(row: dict[str, Any]) -> str:
    """batchfold's split of a row for a progress line; "" for other systems."""
    if "record_s" not in row:
        return ""
    return (
        f"  record {row['record_s']:.3f}s schedule {row['schedule_s']:.3f}s "
        f"execute(forward) {row['execute_s']:.3f}s, {row['record_us_per_node']:.1f} us/node"
    )
