"""The Stanford Sentiment Treebank: PTB bracketed trees with a sentiment label 0-4 on every node.

Each line of ``train.txt``, ``dev.txt`` and ``test.txt`` holds one binarized tree such as
``(3 (2 It) (4 (2 's) (4 good)))``. :func:`load_sst` reads a whole split, from a data folder,
the cache, or a download from Stanford. The tree type and the parser of one line
(:class:`Tree`, :func:`parse_tree`, :func:`unescape_word`) are in
:mod:`batchfold.data.sst_tree` and importable from here as well.
"""

from __future__ import annotations

import http.client
import os
import shutil
import tempfile
import urllib.request
import zipfile
from pathlib import Path
from typing import Literal

from batchfold.data.paths import UNREADABLE, cache_dir, find_data, not_utf8
from batchfold.data.sst_tree import Tree, parse_tree, unescape_word
from batchfold.errors import SSTFormatError

__all__ = [
    "SST_URL",
    "SSTFormatError",
    "Split",
    "Tree",
    "load_sst",
    "parse_tree",
    "unescape_word",
]

SST_URL = "https://nlp.stanford.edu/sentiment/trainDevTestTrees_PTB.zip"
"""Where Stanford distributes the PTB-format SST trees (``trees/{train,dev,test}.txt``)."""

Split = Literal["train", "dev", "test"]
"""The name of one of the three standard SST splits."""

_SPLITS = ("train", "dev", "test")


def _download(url: str, dest: Path) -> None:
    """Fetch ``url`` into the file ``dest`` (written under a temporary name, then renamed)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=60) as response:
            shutil.copyfileobj(response, out)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _extract(archive: Path, folder: Path) -> None:
    """Copy ``trees/{train,dev,test}.txt`` out of the official archive into ``folder``."""
    with zipfile.ZipFile(archive) as zf:
        names = {Path(name).name: name for name in zf.namelist() if name.endswith(".txt")}
        for split in _SPLITS:
            member = names.get(f"{split}.txt")
            if member is None:
                raise FileNotFoundError(f"{archive}: no {split}.txt in the archive")
            target = folder / f"{split}.txt"
            tmp = target.with_suffix(".txt.part")
            with zf.open(member) as src, open(tmp, "wb") as out:
                shutil.copyfileobj(src, out)
            os.replace(tmp, target)


def _not_found(reason: str) -> FileNotFoundError:
    return FileNotFoundError(
        f"{reason}. Get trainDevTestTrees_PTB.zip from {SST_URL} (Stanford NLP), unzip it and "
        "pass the folder holding train.txt, dev.txt and test.txt as path=..., or put it at "
        "$BATCHFOLD_DATA/sst."
    )


def _sst_folder(path: str | os.PathLike[str] | None) -> Path:
    """The folder holding the SST split files, downloading them into the cache if need be."""
    folder = find_data("sst", path)
    if folder is not None:
        return folder
    if path is not None:
        raise _not_found(f"no SST folder at {path}")
    cache = cache_dir("sst")
    if all((cache / f"{split}.txt").is_file() for split in _SPLITS):
        return cache
    archive = cache / "trainDevTestTrees_PTB.zip"
    try:
        _download(SST_URL, archive)
        _extract(archive, cache)
    except (OSError, zipfile.BadZipFile, http.client.HTTPException) as err:
        raise _not_found(
            f"SST data not found (no sst folder under $BATCHFOLD_DATA or shared/data) and the "
            f"download into {cache} failed ({err})"
        ) from err
    archive.unlink(missing_ok=True)
    return cache


def load_sst(split: Split, path: str | os.PathLike[str] | None = None) -> list[Tree]:
    """Read one split of the Stanford Sentiment Treebank.

    The folder holding ``<split>.txt`` is ``path`` when given, else the ``sst`` data folder
    found by :func:`batchfold.data.paths.find_data`, else a copy in :func:`~batchfold.data.paths.cache_dir`, which
    is downloaded from :data:`SST_URL` the first time.

    Arguments:
        split: ``"train"`` (8,544 trees), ``"dev"`` (1,101) or ``"test"`` (2,210).
        path: a folder holding ``train.txt``, ``dev.txt`` and ``test.txt``.

    Returns:
        The trees, in file order.

    Raises:
        ValueError: ``split`` is not one of the three names.
        FileNotFoundError: no data was found and it could not be downloaded; the message
            says where to get it.
        SSTFormatError: a line is malformed (its message names the file, line and column).

    Example:
        >>> load_sst("valid")
        Traceback (most recent call last):
        ...
        ValueError: unknown SST split 'valid'; expected 'train', 'dev' or 'test'
    """
    if split not in _SPLITS:
        raise ValueError(f"unknown SST split {split!r}; expected 'train', 'dev' or 'test'")
    file = _sst_folder(path) / f"{split}.txt"
    if not file.is_file():
        raise _not_found(f"no {split}.txt in {file.parent}")
    source = str(file)
    with open(file, encoding="utf-8") as f:
        try:
            return [parse_tree(line, source=source, line_no=i) for i, line in enumerate(f, 1)]
        except UNREADABLE as error:
            raise not_utf8(file, error) from None
