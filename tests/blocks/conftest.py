"""Every blocks test runs twice: with the generated walk functions and with the walkers' closures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import batchfold.blocks.compiler as compiler


@pytest.fixture(autouse=True, params=["generated", "closures"])
def walks(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``"closures"`` compiles models without code generation (each walker's own walk)."""
    if request.param == "closures":
        monkeypatch.setattr(compiler, "generate", lambda walker, name: walker.walk)
    yield request.param
