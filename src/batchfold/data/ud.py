"""UD English-EWT: finding, downloading and loading its splits, and the index maps of a model.

:func:`load_ud` reads one split of UD English-EWT (``en_ewt-ud-{train,dev,test}.conllu``, plain
or gzipped) into a list of :class:`~batchfold.data.conllu.Sentence`, downloading it into
:func:`~batchfold.data.paths.cache_dir` when it is nowhere to be found. :func:`build_vocabs` makes the index maps a
tagger or parser needs (words, characters, UPOS tags, dependency relations).
"""

from __future__ import annotations

import os
import shutil
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from batchfold.data.conllu import Sentence, read_conllu
from batchfold.data.paths import cache_dir, data_roots, find_data
from batchfold.data.vocab import LabelSet, Vocab

__all__ = [
    "UD_EWT_REPO",
    "UD_EWT_URL",
    "Split",
    "UDVocabs",
    "build_vocabs",
    "download_ud",
    "load_ud",
]

Split = Literal["train", "dev", "test"]
"""The name of one of the three standard UD splits."""

UD_EWT_REPO = "https://github.com/UniversalDependencies/UD_English-EWT"
"""The repository that publishes UD English-EWT."""

UD_EWT_URL = (
    "https://raw.githubusercontent.com/UniversalDependencies/UD_English-EWT/master/"
    "en_ewt-ud-{split}.conllu"
)
"""Where the raw CoNLL-U file of one EWT split is downloaded from (``{split}`` is filled in)."""

_SPLITS = ("train", "dev", "test")
_DATA_NAME = "ud-ewt"


def download_ud(split: Split, folder: str | os.PathLike[str] | None = None) -> Path:
    """Download the raw CoNLL-U file of one EWT split from GitHub.

    The file is written under a temporary name and renamed when complete, so an interrupted
    download leaves nothing that looks finished.

    Arguments:
        split: ``"train"``, ``"dev"`` or ``"test"``.
        folder: where to put it; :func:`~batchfold.data.paths.cache_dir` when ``None``.

    Returns:
        The path of ``en_ewt-ud-{split}.conllu``.

    Raises:
        ValueError: ``split`` is not one of the three names.
        OSError: the download failed (no network, HTTP error, ...).
    """
    _check_split(split)
    target_dir = Path(folder) if folder is not None else cache_dir(_DATA_NAME)
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / f"en_ewt-ud-{split}.conllu"
    partial = target.with_name(target.name + ".part")
    try:
        url = UD_EWT_URL.format(split=split)
        with urllib.request.urlopen(url, timeout=60) as response, partial.open("wb") as out:
            shutil.copyfileobj(response, out)
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def _check_split(split: str) -> None:
    if split not in _SPLITS:
        raise ValueError(f"expected a split among {', '.join(_SPLITS)}, found {split!r}")


def load_ud(
    split: Split, path: str | os.PathLike[str] | None = None, treebank: str = "en_ewt"
) -> list[Sentence]:
    """Load one split of a UD treebank (by default English-EWT) as a list of sentences.

    The file ``{treebank}-ud-{split}.conllu`` (or ``.conllu.gz``) is looked for in the folder
    ``path`` when given; otherwise in the ``ud-ewt`` data folder (see
    :func:`batchfold.data.paths.find_data`: ``$BATCHFOLD_DATA/ud-ewt``, then ``shared/data``),
    then in :func:`~batchfold.data.paths.cache_dir`. When English-EWT is still missing and no ``path`` was given, it
    is downloaded into :func:`~batchfold.data.paths.cache_dir` (see :func:`download_ud`).

    Arguments:
        split: ``"train"``, ``"dev"`` or ``"test"``.
        path: the folder holding the files, or ``None`` to search.
        treebank: the file name prefix, such as ``"en_ewt"``.

    Returns:
        The sentences of the split, in file order.

    Raises:
        ValueError: ``split`` is not one of the three names.
        FileNotFoundError: the file is nowhere to be found and could not be downloaded; the
            message says where to get it.
        ConlluFormatError: the file is malformed.
    """
    _check_split(split)
    stem = f"{treebank}-ud-{split}.conllu"
    names = (stem + ".gz", stem)
    folders: list[Path] = []
    found = find_data(_DATA_NAME, path)
    if found is not None:
        folders.append(found)
    if path is None:
        folders.append(cache_dir(_DATA_NAME))
    for folder in folders:
        for name in names:
            if (folder / name).is_file():
                return read_conllu(folder / name)
    reason = ""
    if path is None and treebank == "en_ewt":
        try:
            return read_conllu(download_ud(split, cache_dir(_DATA_NAME)))
        except OSError as err:
            reason = f" Downloading {UD_EWT_URL.format(split=split)} failed: {err}."
    if path is not None:
        looked = [Path(path)]
    else:
        looked = [root / _DATA_NAME for root in data_roots()] + [cache_dir(_DATA_NAME)]
    raise FileNotFoundError(
        f"{stem} (or {stem}.gz) was not found; looked in {', '.join(map(str, looked))}."
        f"{reason} Get UD English-EWT from {UD_EWT_REPO} (release files "
        f"en_ewt-ud-{{train,dev,test}}.conllu), put them in a folder and pass it as path=, "
        f"or put them in a folder named {_DATA_NAME} under $BATCHFOLD_DATA."
    )


# ----------------------------------------------------------------------------------------------
# Vocabularies


@dataclass(frozen=True)
class UDVocabs:
    """The index maps of a tagger or parser, built by :func:`build_vocabs`.

    Arguments:
        words: word forms, ``<unk>`` at id 0.
        chars: characters of the word forms, ``<unk>`` at id 0.
        upos: the UPOS tags, sorted.
        deprels: the full dependency relations (with subtypes), sorted.
    """

    words: Vocab
    chars: Vocab
    upos: LabelSet
    deprels: LabelSet


def build_vocabs(sentences: Iterable[Sentence], *, min_count: int = 1) -> UDVocabs:
    """Build word, character, UPOS and relation index maps from training sentences.

    Words and characters are numbered by descending count (see
    :class:`batchfold.data.vocab.Vocab`), with ``<unk>`` at 0 for anything unseen; tags and
    relations are closed sets, sorted, with no unknown entry.

    Arguments:
        sentences: the sentences to count (usually the training split).
        min_count: the fewest occurrences a word needs to get its own id (characters are all
            kept).

    Returns:
        The four maps.

    Raises:
        ValueError: ``min_count`` is below 1.

    Example:
        >>> s = Sentence(("I", "ran"), ("PRON", "VERB"), (2, 0), ("nsubj", "root"))
        >>> v = build_vocabs([s, s])
        >>> v.words.encode(["ran", "fast"]), len(v.chars), v.upos.labels, v.deprels.index("root")
        ([2, 0], 5, ('PRON', 'VERB'), 1)
    """
    sentences = list(sentences)
    words = [w for s in sentences for w in s.words]
    return UDVocabs(
        words=Vocab(words, min_count=min_count),
        chars=Vocab(c for w in words for c in w),
        upos=LabelSet(sorted({t for s in sentences for t in s.upos})),
        deprels=LabelSet(sorted({d for s in sentences for d in s.deprels})),
    )
