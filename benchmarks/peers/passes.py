"""The peers' timing loop: untimed warm-up items, then timed passes over every item.

Standard library only (and ``benchmarks/memory.py``, which the caller puts on the path), so that
every peer script can import it from its own virtual environment.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import memory


def timed_passes(
    items: Sequence[Any],
    get: Callable[[Any], Any],
    train_step: Callable[[Any], Any] | None,
    infer_step: Callable[[Any], Any] | None,
    warm_items: Sequence[Any],
    repeats: int,
) -> tuple[list[float], list[float], memory.PeakMemory]:
    """Seconds of each timed pass over ``items``, for training and for inference.

    Each step gets ``get(item)``; a step that is ``None`` is not run. ``warm_items`` run through
    both steps first, untimed. Then ``repeats`` times: one pass of ``train_step`` over every
    item, timed, and one of ``infer_step``. Returns both lists of seconds and the peak memory
    of the whole (warm-up included).
    """
    train_times: list[float] = []
    infer_times: list[float] = []
    with memory.PeakMemory() as peak:
        for item in warm_items:
            for step in (train_step, infer_step):
                if step is not None:
                    step(get(item))
        for _ in range(repeats):
            for step, times in ((train_step, train_times), (infer_step, infer_times)):
                if step is not None:
                    start = time.perf_counter()
                    for item in items:
                        step(get(item))
                    times.append(time.perf_counter() - start)
    return train_times, infer_times, peak
