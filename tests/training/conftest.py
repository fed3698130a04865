"""Fixtures of the training tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from sst_files import TinySST, make_tiny_sst


@pytest.fixture
def tiny_sst(tmp_path: Path) -> TinySST:
    """A tiny SST data set with GloVe-format vectors, written under ``tmp_path``."""
    return make_tiny_sst(tmp_path)
