"""One self-contained HTML page about a training run: ``batchfold report RUN_DIR``.

:func:`write_report` reads a run folder written by ``batchfold train`` (``config.json``,
``metrics.jsonl``, ``test.json`` and, from runs that have one, ``profile.json``, the profile
of one sample batch made by :mod:`batchfold.training.sample`) and writes ``report.html``:
the configuration, the learning curves, the speed against one item at a time and, for the
sample batch, the plan (every step in order with its op, batch size and time), the
batch-size distribution, the share of each phase, the fallbacks and the profiler's table.
Charts are inline SVG (PNG for plans of many steps), styles are inline, and there is no
JavaScript: the file opens anywhere, without a server or a network.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
from collections.abc import Iterable, Sequence
from html import escape
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from batchfold.errors import ConfigError

__all__ = ["write_report"]

_SVG_MAX_STEPS = 300  # a plan with more steps is drawn as a PNG: SVG would grow too large
_PHASE_COLOURS = {
    "record": "#4c78a8",
    "schedule": "#f58518",
    "execute": "#54a24b",
    "backward": "#e45756",
}
_CSS = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#222;
margin:0;background:#f6f7f9}
main{max-width:1100px;margin:0 auto;padding:24px 28px 48px;background:#fff}
h1{font-size:26px;margin:0 0 4px}h2{font-size:19px;margin:32px 0 8px;
border-bottom:1px solid #ddd;padding-bottom:4px}
.sub{color:#666;margin:0 0 16px}.note{color:#666;font-size:13px}
.cards{display:flex;flex-wrap:wrap;gap:12px;margin:16px 0}
.card{border:1px solid #ddd;border-radius:6px;padding:8px 14px;min-width:150px}
.card b{display:block;font-size:20px}.card span{color:#666;font-size:13px}
table{border-collapse:collapse;font-size:13px;margin:8px 0}
th,td{padding:3px 10px;border-bottom:1px solid #eee;text-align:left}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
tbody tr:nth-child(odd){background:#fafafa}
.cols{columns:3;column-gap:24px}.cols table{width:100%;margin:0;break-inside:avoid}
figure{margin:8px 0}figure svg,figure img{max-width:100%;height:auto}
.bar{display:flex;height:28px;border-radius:4px;overflow:hidden;margin:6px 0}
.bar div{color:#fff;font-size:12px;line-height:28px;padding:0 6px;white-space:nowrap;
overflow:hidden}
.legend span{display:inline-block;margin-right:14px;font-size:13px}
.legend i{display:inline-block;width:11px;height:11px;margin-right:4px;vertical-align:-1px}
pre{background:#f4f4f4;padding:10px;overflow-x:auto;font-size:12px}
"""


def _read_json(file: Path) -> Any:
    return _parse(file, file.read_text()) if file.is_file() else None


def _read_history(file: Path) -> list[dict[str, Any]]:
    lines = file.read_text().splitlines() if file.is_file() else []
    return [_parse(file, line, i) for i, line in enumerate(lines, 1) if line.strip()]


def _parse(file: Path, text: str, line: int = 0) -> Any:
    """JSON text read from ``file`` (``line``: where in it), its errors naming the file."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        where = f"{file}:{line}" if line else f"{file}:{error.lineno}"
        raise ConfigError(f"{where}: not JSON ({error.msg}); was the run cut short?") from None


def _number(value: Any, digits: int = 2) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "" if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}" if abs(value) >= 1 or value == 0 else f"{value:.4f}"


def _figure(width: float, height: float) -> Figure:
    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _embed(figure: Figure, name: str, alt: str, png: bool = False) -> str:
    """``figure`` as inline SVG (text kept as text, no metadata), or as a base64 PNG."""
    buffer = io.BytesIO()
    if png:
        figure.savefig(buffer, format="png", dpi=90)
        data = base64.b64encode(buffer.getvalue()).decode("ascii")
        return f'<figure><img alt="{escape(alt)}" src="data:image/png;base64,{data}"></figure>'
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": name}):
        figure.savefig(buffer, format="svg", metadata={"Date": None})
    svg = buffer.getvalue().decode("utf-8")
    svg = svg[svg.index("<svg") :]  # drop the XML declaration and the DOCTYPE
    svg = re.sub(r"<metadata>.*?</metadata>", "", svg, flags=re.DOTALL)
    svg = svg.replace("<svg ", f'<svg role="img" aria-label="{escape(alt)}" ', 1)
    return f"<figure>{svg}</figure>"


def _table(head: Sequence[str], rows: Iterable[Sequence[Any]], numeric: set[int]) -> str:
    def cell(tag: str, i: int, value: Any) -> str:
        attr = ' class="n"' if i in numeric else ""
        return f"<{tag}{attr}>{escape(_number(value))}</{tag}>"

    header = "".join(cell("th", i, name) for i, name in enumerate(head))
    body = "".join(
        "<tr>" + "".join(cell("td", i, v) for i, v in enumerate(row)) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{header}</tr></thead><tbody>{body}</tbody></table>"


# -- sections ---------------------------------------------------------------------------------


def _summary(config: dict[str, Any], summary: dict[str, Any] | None) -> str:
    cards: list[tuple[str, str]] = []
    if summary:
        if summary.get("best_epoch") is not None:
            kept = "epoch (the last)" if summary.get("keep") == "last" else "best dev epoch"
            cards.append((str(summary["best_epoch"]), kept))
        for name, value in (summary.get("test") or {}).items():
            cards.append((_number(value), f"test {name.removeprefix('test_')}"))
        unit = summary.get("unit") or "items"
        if summary.get("train_items_per_s") is not None:
            cards.append((_number(summary["train_items_per_s"], 1), f"training {unit}/s"))
        if summary.get("throughput"):
            cards.append((f"{summary['throughput']['speedup']:.1f}x", "vs one at a time"))
    if not cards:
        return '<p class="note">No test.json: the run has not finished.</p>'
    return (
        '<div class="cards">'
        + "".join(
            f'<div class="card"><b>{escape(v)}</b><span>{escape(k)}</span></div>' for v, k in cards
        )
        + "</div>"
    )


def _config_section(config: dict[str, Any]) -> str:
    items = list(config.items())
    third = -(-len(items) // 3)
    tables = [
        _table(("option", "value"), [(k, json.dumps(v)) for k, v in items[i : i + third]], set())
        for i in range(0, len(items), max(third, 1))
    ]
    return '<h2>Configuration</h2><div class="cols">' + "".join(tables) + "</div>"


def _curves(history: list[dict[str, Any]], task: str) -> str:
    if not history:
        return "<h2>Learning curves</h2><p class='note'>No epochs in metrics.jsonl.</p>"
    figure = _figure(11, 3.6)
    loss_axes, dev_axes = figure.subplots(1, 2)
    epochs = [r["epoch"] for r in history]
    loss_axes.plot(epochs, [r["train_loss"] for r in history], marker="o", ms=3)
    loss_axes.set(xlabel="epoch", ylabel="loss per term", title="training loss")
    names = list(dict.fromkeys(name for r in history for name in r.get("dev", {})))
    for name in names:
        values = [r.get("dev", {}).get(name, float("nan")) for r in history]
        dev_axes.plot(epochs, values, marker="o", ms=3, label=name)
    dev_axes.set(xlabel="epoch", title="dev metrics")
    if names:
        dev_axes.legend(fontsize=8)
    for axes in (loss_axes, dev_axes):
        axes.grid(alpha=0.3)
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        if len(epochs) <= 12:
            axes.set_xticks(epochs)
    rows = [
        (r["epoch"], r["train_loss"], *(r.get("dev", {}).get(n) for n in names), r["items_per_s"])
        for r in history
    ]
    table = _table(("epoch", "loss", *names, "items/s"), rows, set(range(len(names) + 3)))
    return (
        "<h2>Learning curves</h2>"
        + _embed(figure, "curves", f"{task} learning curves")
        + f"<details><summary>per epoch</summary>{table}</details>"
    )


def _speed(summary: dict[str, Any] | None) -> str:
    speed = (summary or {}).get("throughput")
    if not speed:
        return (
            "<h2>Speed</h2><p class='note'>No comparison with one item at a time "
            "(the task has no eager baseline, or --compare-batches 0).</p>"
        )
    unit = (summary or {}).get("unit") or "items"
    figure = _figure(8, 1.5)
    axes = figure.subplots()
    values = [speed["one_at_a_time_per_s"], speed["batched_per_s"]]
    bars = axes.barh(["one at a time", "batched"], values, color=["#999999", "#4c78a8"])
    axes.bar_label(bars, labels=[f"{v:,.1f} {unit}/s" for v in values], padding=4, fontsize=9)
    axes.set_xlim(0, max(values) * 1.25)
    axes.set_xlabel(f"{unit} per second, forward + backward")
    for side in ("top", "right"):
        axes.spines[side].set_visible(False)
    return (
        "<h2>Speed against one item at a time</h2>"
        + f"<p>Forward and backward of {speed['items']} {escape(unit)} on the same weights, "
        + f"batched and one at a time: <b>{speed['speedup']:.1f}x</b>.</p>"
        + _embed(figure, "speed", "batched against one at a time")
    )


def _colours(ops: list[str]) -> dict[str, Any]:
    """One colour per op: the 19 most frequent in tab10's, then tab20's light colours."""
    counts: dict[str, int] = {}
    for op in ops:
        counts[op] = counts.get(op, 0) + 1
    palette = [
        *matplotlib.colormaps["tab10"].colors,  # type: ignore[attr-defined]
        *matplotlib.colormaps["tab20"].colors[1::2][:9],  # type: ignore[attr-defined]
    ]
    ranked = sorted(counts, key=lambda op: -counts[op])
    return {op: palette[i] if i < 19 else "#bbbbbb" for i, op in enumerate(ranked)}


def _plan(steps: list[dict[str, Any]]) -> str:
    colours = _colours([s["op"] for s in steps])
    figure = _figure(11, 4.6)
    size_axes, time_axes = figure.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    x = range(1, len(steps) + 1)
    step_colours = [colours[s["op"]] for s in steps]
    width = 0.9 if len(steps) < 200 else 1.0
    size_axes.bar(x, [s["batch"] for s in steps], width=width, color=step_colours)
    size_axes.set(ylabel="batch size", title="the plan: steps in the order they ran")
    time_axes.bar(x, [s["forward_ms"] for s in steps], width=width, color=step_colours)
    time_axes.set(xlabel="step", ylabel="forward ms")
    for axes in (size_axes, time_axes):
        axes.grid(axis="y", alpha=0.3)
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    chart = _embed(figure, "plan", "the plan", png=len(steps) > _SVG_MAX_STEPS)
    shown = list(colours.items())[:19]
    legend = "".join(
        f'<span><i style="background:{to_hex(c)}"></i>{escape(op)}</span>' for op, c in shown
    )
    if len(colours) > 19:
        legend += f"<span><i style='background:#bbbbbb'></i>{len(colours) - 19} other ops</span>"
    return chart + f'<p class="legend">{legend}</p>'


def _histogram(steps: list[dict[str, Any]]) -> str:
    sizes = [s["batch"] for s in steps]
    figure = _figure(11, 2.6)
    axes = figure.subplots()
    counts: dict[int, int] = {}
    for size in sizes:
        counts[size] = counts.get(size, 0) + 1
    if max(counts, default=0) <= 60:  # one bar per batch size
        axes.bar(list(counts), list(counts.values()), width=0.8, color="#4c78a8")
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    else:  # sizes from 1 to thousands: bins of equal width on a log scale
        edges = [(max(sizes) + 1) ** (i / 30) for i in range(31)]
        axes.hist(sizes, bins=edges, color="#4c78a8", edgecolor="white")
        axes.set_xscale("log")
    axes.set(xlabel="batch size (nodes per step)", ylabel="steps", title="batch sizes")
    axes.grid(axis="y", alpha=0.3)
    return _embed(figure, "histogram", "batch-size distribution")


def _phases(phases: dict[str, float]) -> str:
    total = sum(phases.values())
    if total <= 0:
        return ""
    parts, legend = [], []
    for name, seconds in phases.items():
        share = 100 * seconds / total
        colour = _PHASE_COLOURS.get(name, "#888888")
        label = f"{name} {seconds * 1e3:.1f} ms ({share:.0f}%)"
        parts.append(
            f'<div style="width:{share:.2f}%;background:{colour}" title="{escape(label)}">'
            f"{escape(name) if share > 8 else ''}</div>"
        )
        legend.append(f'<span><i style="background:{colour}"></i>{escape(label)}</span>')
    return (
        "<h3>Share of each phase</h3>"
        + f'<div class="bar">{"".join(parts)}</div><p class="legend">{"".join(legend)}</p>'
    )


def _profile_section(profile: dict[str, Any] | None, config: dict[str, Any]) -> str:
    head = "<h2>A sample batch</h2>"
    if profile is None:
        return head + (
            '<p class="note">This run folder has no profile.json (runs written by '
            "<code>batchfold train</code> before it profiled a sample batch at the end). "
            "Train again to see the plan, the batch sizes, the phases and the profiler's "
            "table.</p>"
        )
    steps = profile["steps"]
    if not steps:
        return head + (
            f"<p class='note'>The task's loss on {profile['items']} items made no batched "
            "call (no batch_map and no blocks model): nothing to show.</p>"
        )
    total_ms = sum(s["forward_ms"] for s in steps)
    out = [
        head,
        f"<p>The first training batch, {profile['items']} items (front end "
        f"<b>{escape(str(profile['front_end']))}</b>, {profile['calls']} call(s)): "
        f"{profile['nodes']:,} nodes in {len(steps):,} steps, mean batch "
        f"{profile['nodes'] / len(steps):.1f}; forward steps {total_ms:.1f} ms, loss and "
        f"backward {profile['seconds'] * 1e3:.1f} ms in all (timed with profiling on, which "
        "adds its own cost).</p>",
        _plan(steps),
        _histogram(steps),
        _phases(profile.get("phases", {})),
        "<h3>Fallbacks</h3>",
    ]
    fallbacks = profile.get("fallbacks") or {}
    if fallbacks:
        items = "".join(
            f"<li><code>{escape(op)}</code>: {count:,} nodes</li>"
            for op, count in sorted(fallbacks.items())
        )
        out.append(
            f"<p>Ops without a batching rule (run by vmap or one at a time):</p><ul>{items}</ul>"
        )
    else:
        out.append("<p>None: every op ran with a batching rule of its own.</p>")
    rows = profile.get("profile") or []
    if rows:
        keys = (
            "signature", "steps", "nodes", "mean_batch", "max_batch", "rows_gathered",
            "output_mb", "forward_ms", "backward_ms", "fallback",
        )  # fmt: skip
        head_names = (
            "signature", "steps", "nodes", "mean batch", "max batch", "rows gathered",
            "out MB", "fwd ms", "bwd ms", "fallback",
        )  # fmt: skip
        table = _table(head_names, [[r.get(k) for k in keys] for r in rows], set(range(1, 9)))
        out.append(f"<h3>The profiler's table</h3>{table}")
        if profile.get("table"):
            out.append(
                f"<details><summary>as text</summary><pre>{escape(profile['table'])}</pre>"
                "</details>"
            )
    return "".join(out)


def write_report(
    run_dir: str | os.PathLike[str], out: str | os.PathLike[str] | None = None
) -> Path:
    """Write the HTML report of a run folder (see the module docstring).

    Arguments:
        run_dir: a folder written by ``batchfold train``.
        out: the HTML file (default: ``run_dir/report.html``).

    Returns:
        The file written.

    Raises:
        ConfigError: ``run_dir`` is not a folder or has no ``config.json``.
    """
    folder = Path(run_dir)
    if not folder.is_dir():
        raise ConfigError(f"{folder}: no such run folder")
    config = _read_json(folder / "config.json")
    if config is None:
        raise ConfigError(f"{folder}: no config.json; is it a folder written by batchfold train?")
    summary = _read_json(folder / "test.json")
    history = _read_history(folder / "metrics.jsonl")
    profile = _read_json(folder / "profile.json")
    task = str(config.get("task", "run"))
    title = f"batchfold {task}: {folder.resolve().name}"
    body = (
        f"<h1>{escape(title)}</h1>"
        + f'<p class="sub">Run folder <code>{escape(str(folder))}</code>, '
        + f"{len(history)} epoch(s)</p>"
        + _summary(config, summary)
        + _config_section(config)
        + _curves(history, task)
        + _speed(summary)
        + _profile_section(profile, config)
    )
    html = (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{_CSS}</style></head>"
        f"<body><main>{body}</main></body></html>\n"
    )
    path = Path(out) if out is not None else folder / "report.html"
    path.write_text(html, encoding="utf-8")
    return path
