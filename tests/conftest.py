"""Strict test settings: fixed seeds, deterministic kernels, float64 where values are compared,
and each test's ``batch_map`` runs on new graphs (no signatures kept from an earlier test: plans
and statistics do not depend on the order tests run in; tests/test_graph_reuse.py covers reuse).

Also the real UD English-EWT splits, read once for the tests of the reader, the loader and the
transition system.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import numpy as np
import pytest
import torch

import batchfold.blocks.compiler as compiler
from batchfold.data.conllu import Sentence
from batchfold.data.paths import find_data
from batchfold.data.ud import load_ud
from batchfold.lazy import graphs


@pytest.fixture(autouse=True)
def _seeded() -> None:
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    graphs.forget()


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


@pytest.fixture(scope="session")
def ewt() -> dict[str, list[Sentence]]:
    """UD English-EWT's three splits; a test that uses them is skipped when they are absent."""
    folder = find_data("ud-ewt")
    if folder is None or not (folder / "en_ewt-ud-train.conllu.gz").is_file():
        pytest.skip("UD English-EWT is not available (see batchfold.data.ud.load_ud)")
    return {split: load_ud(split, path=folder) for split in ("train", "dev", "test")}
