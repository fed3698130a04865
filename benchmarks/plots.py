"""PNG plots of a suite run: throughput, batchfold's time split and recording cost, scheduling.

Each function takes the suite's results (``run_suite.py``) and a folder, writes PNG files
there and returns their paths. Plots are made with matplotlib's non-interactive backend.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SPLIT = (
    ("record_s", "record"),
    ("schedule_s", "schedule"),
    ("execute_s", "execute (forward)"),
)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _lines(ax: Any, series: dict[str, list[tuple[int, float]]], ylabel: str) -> None:
    for i, (label, points) in enumerate(sorted(series.items())):
        points.sort()
        style = ("-", "--", ":")[i // 10 % 3]  # the colour cycle has 10 colours
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        ax.plot(xs, ys, marker="o", linestyle=style, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size (trees)")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def treelstm_throughput(results: dict[str, Any], folder: Path) -> list[Path]:
    """Trees per second against batch size, one line per system, per (workload, mode)."""
    groups: dict[tuple[str, str], dict[str, list[tuple[int, float]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for r in results["rows"]:
        groups[(r["workload"], r["mode"])][r["system"]].append((r["batch_size"], r["trees_per_s"]))
    paths = []
    for (workload, mode), series in groups.items():
        fig, ax = plt.subplots(figsize=(7, 4.5))
        _lines(ax, series, "trees per second")
        ax.set_title(f"Tree-LSTM, {workload}, {mode}")
        paths.append(_save(fig, folder / f"treelstm-{_slug(workload)}-{mode}.png"))
    return paths


def fold_throughput(results: dict[str, Any], folder: Path) -> list[Path]:
    """Trees per second against batch size per (mode, system), one plot per state size."""
    groups: dict[int, dict[str, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    for r in results["rows"]:
        label = r["system"] if r["mode"] == "manual" else f"{r['system']} ({r['mode']})"
        groups[r["state"]][label].append((r["batch_size"], r["trees_per_s"]))
    paths = []
    for state, series in groups.items():
        fig, ax = plt.subplots(figsize=(7, 4.5))
        _lines(ax, series, "trees per second (training)")
        ax.set_title(f"TensorFlow Fold's ICLR 2017 benchmark, state {state}")
        paths.append(_save(fig, folder / f"fold-state-{state}.png"))
    return paths


def batchfold_split(suite: dict[str, Any], folder: Path) -> list[Path]:
    """batchfold's step time split into record, schedule, forward execution and the rest."""
    bars: list[tuple[str, dict[str, float]]] = []
    tree = suite["benchmarks"].get("treelstm") or {"rows": []}
    for r in tree["rows"]:
        if "record_s" in r and r["mode"] == "training":
            bars.append((f"Tree-LSTM {r['workload']}, b={r['batch_size']}, {r['system']}", r))
    fold = suite["benchmarks"].get("fold") or {"rows": []}
    for r in fold["rows"]:
        if "record_s" in r:
            label = f"Fold {r['state']} {r['mode']}, b={r['batch_size']}, {r['system']}"
            bars.append((label, r))
    if not bars:
        return []
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(bars) + 1.5))
    labels = [label for label, _ in bars]
    left = [0.0] * len(bars)
    for key, name in SPLIT:
        share = [100 * r[key] / r["median_s"] for _, r in bars]
        ax.barh(labels, share, left=left, label=name)
        left = [a + b for a, b in zip(left, share, strict=True)]
    rest = [max(100 - x, 0.0) for x in left]
    ax.barh(labels, rest, left=left, label="backward, optimizer, loss", color="lightgray")
    ax.set_xlabel("% of the training step")
    ax.set_xlim(0, 100)
    ax.invert_yaxis()
    ax.tick_params(axis="y", labelsize=7)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title("batchfold: where a training step's time goes")
    return [_save(fig, folder / "batchfold-split.png")]


def record_per_node(suite: dict[str, Any], folder: Path) -> list[Path]:
    """Recording time per graph node of each batchfold system (median over its rows)."""
    found: dict[str, list[float]] = defaultdict(list)
    for bench, title in (("treelstm", "Tree-LSTM"), ("fold", "Fold")):
        for r in (suite["benchmarks"].get(bench) or {"rows": []})["rows"]:
            if "record_us_per_node" in r:
                found[f"{title}: {r['system']}"].append(r["record_us_per_node"])
    if not found:
        return []
    labels = sorted(found)
    values = [statistics.median(found[label]) for label in labels]
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(labels) + 1.5))
    ax.barh(labels, values)
    for y, value in enumerate(values):
        ax.annotate(
            f"{value:.1f}",
            (value, y),
            xytext=(3, 0),
            textcoords="offset points",
            va="center",
            fontsize=7,
        )
    ax.set_xlabel("recording, microseconds per graph node (median over configurations)")
    ax.invert_yaxis()
    ax.tick_params(axis="y", labelsize=7)
    ax.set_title("batchfold: recording cost by front end and scheduler")
    return [_save(fig, folder / "batchfold-record-per-node.png")]


def schedule_rate(results: dict[str, Any], folder: Path) -> list[Path]:
    """Nodes scheduled per second against graph size, per (graph, scheduler)."""
    series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for r in results["rows"]:
        series[f"{r['workload']}, {r['scheduler']}"].append((r["nodes"], r["nodes_per_s"]))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    _lines(ax, series, "nodes scheduled per second")
    ax.set_xscale("log", base=10)
    ax.set_xlabel("nodes in the graph")
    ax.set_title("Scheduling alone")
    return [_save(fig, folder / "schedule.png")]


def all_plots(suite: dict[str, Any], folder: Path) -> list[Path]:
    """Every plot the suite's results allow; returns the files written."""
    folder.mkdir(parents=True, exist_ok=True)
    benchmarks = suite["benchmarks"]
    paths = []
    if benchmarks.get("treelstm"):
        paths += treelstm_throughput(benchmarks["treelstm"], folder)
    if benchmarks.get("fold"):
        paths += fold_throughput(benchmarks["fold"], folder)
    if benchmarks.get("schedule"):
        paths += schedule_rate(benchmarks["schedule"], folder)
    return paths + batchfold_split(suite, folder) + record_per_node(suite, folder)
