"""Helpers for tests that compare the short path of ragged module calls with the slow one."""

from __future__ import annotations

from typing import Any

import pytest

import batchfold as bf
from batchfold.lazy import macros


def count_fast_path(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Route ``ragged_hit`` through a counter: the list gets, per call, whether it was taken."""
    taken: list[bool] = []
    fast = macros.ragged_hit

    def counted(*args: Any) -> Any:
        found = fast(*args)
        taken.append(found is not None)
        return found

    monkeypatch.setattr(macros, "ragged_hit", counted)
    return taken


def no_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Send every ragged call down the slow path."""
    monkeypatch.setattr(macros, "ragged_hit", lambda *args: None)


def plan_steps(stats: bf.Stats) -> list[tuple[str, int]]:
    """Each step of a run's plan: its op's name and its number of nodes."""
    assert stats.plan is not None
    return [(s.sig.name, len(s.nodes)) for s in stats.plan.steps]
