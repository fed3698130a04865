"""Strict test settings: fixed seeds, deterministic kernels, float64 where values are compared."""

from __future__ import annotations

import random
from collections.abc import Iterator

import numpy as np
import pytest
import torch

import batchfold.blocks.compiler as compiler


@pytest.fixture(autouse=True)
def _seeded() -> None:
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)


@pytest.fixture
def float64() -> Iterator[None]:
    """Make float64 the default dtype for one test, so values compare to 1e-10."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


@pytest.fixture(params=["generated", "closures"])
def walks(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Compile blocks with generated walk functions, or (``"closures"``) without them."""
    if request.param == "closures":
        monkeypatch.setattr(compiler, "generate", lambda walker, name: walker.walk)
    yield request.param
