"""A ``.gz`` data file cut short (an interrupted download) or not gzip at all is named in a
clear error by every reader, where an ``EOFError`` or a message without the file came out."""

from __future__ import annotations

import gzip
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conllu_samples import SMALL

from batchfold.data.conllu import read_conllu
from batchfold.data.glove import iter_glove
from batchfold.data.molecule_csv import read_molecule_csv

GLOVE = "".join(f"w{i} {i} {i + 1} {i + 2}\n" for i in range(4000))
CSV = "smiles,y\n" + "".join(f"{'C' * (1 + i % 9)},{i % 2}\n" for i in range(4000))

READERS: dict[str, tuple[str, Callable[[Path], Any]]] = {
    "glove": (GLOVE, lambda f: list(iter_glove(f))),
    "conllu": (SMALL * 200, read_conllu),
    "csv": (CSV, lambda f: read_molecule_csv(f, label_columns=["y"])),
}


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("damage", ["cut short", "not gzip"])
def test_a_damaged_gzip_file_is_named(reader: str, damage: str, tmp_path: Path) -> None:
    text, read = READERS[reader]
    whole = gzip.compress(text.encode())
    file = tmp_path / f"data.{reader}.gz"
    file.write_bytes(whole[: len(whole) // 2] if damage == "cut short" else text.encode())
    with pytest.raises(ValueError, match=re.escape(f"{file}: not a whole gzip file")):
        read(file)
    file.write_bytes(whole)  # the whole file reads
    assert read(file)
