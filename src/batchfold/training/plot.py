"""Learning curves as a PNG: training loss and dev metrics per epoch.

Drawn with matplotlib's Agg canvas directly, so no display and no global backend are needed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

__all__ = ["plot_curves"]


def plot_curves(
    history: Sequence[Mapping[str, Any]], path: str | os.PathLike[str], title: str = ""
) -> None:
    """Write a two-panel PNG: training loss per epoch, and every dev metric per epoch.

    Arguments:
        history: one record per epoch, as in ``metrics.jsonl``: ``epoch``, ``train_loss`` and
            ``dev`` (a dict of metric name to value).
        path: the PNG file to write.
        title: the figure's title.

    Raises:
        ValueError: ``history`` is empty.

    Example:
        >>> import tempfile, pathlib
        >>> png = pathlib.Path(tempfile.mkdtemp()) / "curves.png"
        >>> plot_curves([{"epoch": 1, "train_loss": 1.2, "dev": {"acc": 40.0}},
        ...              {"epoch": 2, "train_loss": 0.9, "dev": {"acc": 45.0}}], png)
        >>> png.read_bytes()[:4] == b"\\x89PNG"
        True
    """
    if not history:
        raise ValueError("plot_curves needs at least one epoch of history, got none")
    epochs = [record["epoch"] for record in history]
    figure = Figure(figsize=(10, 4), layout="constrained")
    FigureCanvasAgg(figure)
    loss_axes, dev_axes = figure.subplots(1, 2)
    loss_axes.plot(epochs, [record["train_loss"] for record in history], marker="o")
    loss_axes.set(xlabel="epoch", ylabel="loss per term", title="training loss")
    names = list(dict.fromkeys(name for record in history for name in record["dev"]))
    for name in names:
        values = [record["dev"].get(name, float("nan")) for record in history]
        dev_axes.plot(epochs, values, marker="o", label=name)
    dev_axes.set(xlabel="epoch", title="dev metrics")
    if names:
        dev_axes.legend()
    for axes in (loss_axes, dev_axes):
        axes.grid(alpha=0.3)
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    if title:
        figure.suptitle(title)
    figure.savefig(os.fspath(path), dpi=100)
