"""GloVe word vectors: reading the text format and building an embedding matrix for a vocabulary.

The project's data folder ``glove-sst`` holds GloVe 6B vectors filtered to the SST words
(``glove.6B.50d.sst.txt.gz``), keyed by the lowercased SST token. The full
``glove.6B.{dim}d.txt`` files from Stanford work too.
"""

from __future__ import annotations

import gzip
import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TextIO

import torch

from batchfold.data.paths import UNREADABLE, find_data, not_utf8
from batchfold.data.sst import unescape_word
from batchfold.data.vocab import Vocab

__all__ = [
    "GLOVE_URL",
    "SIDE_BY_SIDE",
    "glove_file",
    "iter_glove",
    "load_word_vectors",
    "word_vectors",
]

GLOVE_URL = "https://nlp.stanford.edu/data/glove.6B.zip"
"""Where Stanford distributes the GloVe 6B vectors (50, 100, 200 and 300 dimensions)."""

SIDE_BY_SIDE = {150: (50, 100)}
"""Word vector sizes read as several GloVe files side by side (150: the 50d and the 100d)."""


def _open(file: Path) -> TextIO:
    if file.suffix == ".gz":
        return gzip.open(file, "rt", encoding="utf-8-sig")  # a byte-order mark is no word
    return open(file, encoding="utf-8-sig")


def _lines(file: Path, dim: int | None) -> Iterator[tuple[int, str, list[str]]]:
    """``(line number, word, value strings)`` for each line, with the value count checked."""
    line_no = 0
    with _open(file) as f:
        lines = enumerate(f, 1)
        while True:
            try:
                line_no, line = next(lines)
            except StopIteration:
                if not line_no:  # 0% coverage would be the only sign
                    raise ValueError(f"{file}: no word vectors in it (an empty file)") from None
                return
            except UNREADABLE as error:  # decoded a block at a time: no line
                raise not_utf8(file, error) from None
            word, *values = line.rstrip("\r\n ").split(" ")
            if not word:
                found = "a space" if values else "an empty line"
                raise ValueError(f"{file}:{line_no}: expected a word and its values, found {found}")
            if dim is None:
                dim = len(values)
            if len(values) != dim or dim == 0:
                raise ValueError(
                    f"{file}:{line_no}: expected {dim or 'some'} values after the word "
                    f"{word!r}, found {len(values)}"
                )
            yield line_no, word, values


def _floats(values: list[str], file: Path, line_no: int) -> list[float]:
    try:
        floats = [float(v) for v in values]
    except ValueError:
        floats = []
    finite = len(floats) == len(values) and all(map(math.isfinite, floats))
    if finite and not any("_" in v for v in values):  # float() reads "1_000" as 1000
        return floats
    bad = next(v for v in values if not _is_float(v))
    raise ValueError(f"{file}:{line_no}: expected a finite number, found {bad!r}")


def _is_float(text: str) -> bool:
    try:
        value = float(text)
    except ValueError:
        return False
    return math.isfinite(value) and "_" not in text


def iter_glove(
    file: str | os.PathLike[str], dim: int | None = None
) -> Iterator[tuple[str, list[float]]]:
    """The ``(word, vector)`` pairs of a GloVe text file (gzip-compressed when it ends in .gz).

    Each line is a word and its values, separated by single ASCII spaces.

    Arguments:
        file: the file to read.
        dim: the number of values every line must have; by default, as many as the first line.

    Returns:
        An iterator over the words and their vectors, in file order.

    Raises:
        ValueError: a line is empty, has the wrong number of values or a value that is not a
            number; the message starts with ``file:line:``.

    Example:
        >>> import tempfile, pathlib
        >>> f = pathlib.Path(tempfile.mkdtemp()) / "tiny.txt"
        >>> _ = f.write_text("the 0.5 -1\\nbad 1 2 3\\n")
        >>> it = iter_glove(f)
        >>> next(it)
        ('the', [0.5, -1.0])
        >>> next(it)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: ...tiny.txt:2: expected 2 values after the word 'bad', found 3
    """
    path = Path(file)
    for line_no, word, values in _lines(path, dim):
        yield word, _floats(values, path, line_no)


def glove_file(path: str | os.PathLike[str] | None = None, dim: int = 50) -> Path:
    """Find the GloVe file of dimension ``dim``.

    ``path`` may name the file itself or a folder; without it the ``glove-sst`` data folder is
    used (see :func:`batchfold.data.paths.find_data`). In a folder the first of
    ``glove.6B.{dim}d.sst.txt.gz``, ``glove.6B.{dim}d.sst-partial.txt.gz``,
    ``glove.6B.{dim}d.txt.gz`` and ``glove.6B.{dim}d.txt`` that exists is taken.

    Arguments:
        path: a GloVe file or a folder holding one.
        dim: the vector dimension, which picks the file name in a folder.

    Returns:
        An existing file.

    Raises:
        FileNotFoundError: no such file; the message says where to get GloVe.

    Example:
        >>> glove_file("no/such/folder")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        FileNotFoundError: no GloVe 50d vectors found at no/such/folder. ...
    """
    found = find_data("glove-sst", path)
    names = [
        f"glove.6B.{dim}d.sst.txt.gz",
        f"glove.6B.{dim}d.sst-partial.txt.gz",
        f"glove.6B.{dim}d.txt.gz",
        f"glove.6B.{dim}d.txt",
    ]
    if found is not None and found.is_file():
        return found
    if found is not None:
        for name in names:
            if (found / name).is_file():
                return found / name
    where = f"at {path}" if path is not None else "(no glove-sst data folder)"
    if found is not None:
        where = f"in {found} (looked for {', '.join(names)})"
    raise FileNotFoundError(
        f"no GloVe {dim}d vectors found {where}. GloVe 6B comes from {GLOVE_URL} (Stanford "
        f"NLP); pass glove.6B.{dim}d.txt or a folder holding it as path=..., or place the "
        f"SST-filtered file glove.6B.{dim}d.sst.txt.gz in a folder named glove-sst under "
        "$BATCHFOLD_DATA."
    )


def load_word_vectors(
    vocab: Vocab | Sequence[str],
    path: str | os.PathLike[str] | None = None,
    dim: int | Sequence[int] = 50,
    seed: int = 0,
    *,
    init_range: float = 0.05,
) -> tuple[torch.Tensor, float]:
    """An embedding matrix for ``vocab`` with GloVe vectors where there are some.

    Row ``i`` is the vector of word ``i`` looked up lowercased (GloVe 6B is uncased), and if
    that is missing, of its unescaped form lowercased (``-LRB-`` as ``(``). A word with no
    vector, and the :data:`~batchfold.data.vocab.UNK` entry of a :class:`Vocab`, gets a
    uniform random vector in ``[-init_range, init_range)``; the random rows come from a
    generator seeded with ``seed`` and do not depend on which words were found.

    Several dimensions read one file each and put the vectors side by side (``(50, 100)``
    gives 150 columns: the 50d vector, then the 100d one), so a word missing from one file
    still carries the other's vector; the ``k``-th file's random rows use seed ``seed + k``.

    Arguments:
        vocab: the vocabulary, or a plain list of words (row ``i`` for ``vocab[i]``).
        path: a GloVe file or a folder holding one (see :func:`glove_file`).
        dim: the vector dimension, or several (``path`` is then a folder).
        seed: the seed of the random vectors.
        init_range: the bound of the random vectors.

    Returns:
        The ``[len(vocab), sum of dim]`` float32 matrix, and the coverage: the fraction of the
        words (not counting a :class:`Vocab`'s UNK entry) that have a GloVe vector in at least
        one file.

    Raises:
        FileNotFoundError: no GloVe file was found.
        ValueError: a malformed line (the message names the file and line).

    Example:
        >>> import tempfile, pathlib
        >>> f = pathlib.Path(tempfile.mkdtemp()) / "tiny.txt"
        >>> _ = f.write_text("good 1 2\\nbad 3 4\\n")
        >>> matrix, coverage = load_word_vectors(Vocab(["Good", "meh"]), f, dim=2)
        >>> matrix[1].tolist(), coverage
        ([1.0, 2.0], 0.5)
    """
    words = vocab.words if isinstance(vocab, Vocab) else list(vocab)
    first = 1 if isinstance(vocab, Vocab) else 0  # the UNK row is never looked up
    keys = [(word.lower(), unescape_word(word).lower()) for word in words[first:]]
    dims = [dim] if isinstance(dim, int) else list(dim)
    if len(dims) > 1 and path is not None and Path(path).is_file():
        raise ValueError(
            f"GloVe vectors of {' and '.join(f'{d}d' for d in dims)} side by side need a "
            f"folder holding one file of each size, not the single file {path}"
        )
    matrices, found = [], set[int]()
    for k, d in enumerate(dims):
        matrix, rows = _matrix(keys, first, glove_file(path, d), d, seed + k, init_range)
        matrices.append(matrix)
        found.update(rows)
    coverage = len(found) / len(keys) if keys else 0.0
    return torch.cat(matrices, dim=1), coverage


def _matrix(
    keys: list[tuple[str, str]], first: int, file: Path, dim: int, seed: int, init_range: float
) -> tuple[torch.Tensor, list[int]]:
    """The ``[first + len(keys), dim]`` matrix of one file, and the rows it had vectors for."""
    wanted = {key for pair in keys for key in pair}
    found: dict[str, list[float]] = {}
    for line_no, word, values in _lines(file, dim):
        if word in wanted and word not in found:
            found[word] = _floats(values, file, line_no)
    generator = torch.Generator().manual_seed(seed)
    matrix = torch.rand(first + len(keys), dim, generator=generator, dtype=torch.float32) * 2 - 1
    matrix *= init_range
    rows: list[int] = []
    vectors: list[list[float]] = []
    for row, (key, fallback) in enumerate(keys, first):
        vector = found.get(key) or found.get(fallback)
        if vector is not None:
            rows.append(row)
            vectors.append(vector)
    if rows:
        matrix[rows] = torch.tensor(vectors, dtype=torch.float32)
    return matrix, rows


def word_vectors(
    vocab: Vocab | Sequence[str],
    path: str | os.PathLike[str] | None,
    word_dim: int,
    seed: int = 0,
) -> tuple[torch.Tensor, dict[str, int]]:
    """:func:`load_word_vectors` for a word vector size, with a printed coverage line.

    ``word_dim`` picks the file ``glove.6B.<word_dim>d``, or several side by side
    (:data:`SIDE_BY_SIDE`). The line printed says how many words have a vector.

    Arguments:
        vocab: the vocabulary (row ``i`` for word ``i``; a :class:`Vocab`'s UNK row is random).
        path: a GloVe file or a folder (``None``: the project's data folder).
        word_dim: the vector size.
        seed: the seed of the random vectors.

    Returns:
        The ``[len(vocab), word_dim]`` matrix, and ``{"dim", "found", "missing"}``: the size
        and how many words have a vector or lack one.

    Raises:
        FileNotFoundError: no GloVe file of that size was found.

    Example:
        >>> import tempfile, pathlib
        >>> f = pathlib.Path(tempfile.mkdtemp()) / "tiny.txt"
        >>> _ = f.write_text("good 1 2\\n")
        >>> matrix, words = word_vectors(Vocab(["good", "meh"]), f, 2)
        glove 2d: vectors for 1 of 2 words (50.0%); 1 words without one get the usual random initialisation
        >>> matrix.shape, words
        (torch.Size([3, 2]), {'dim': 2, 'found': 1, 'missing': 1})
    """
    dims = SIDE_BY_SIDE.get(word_dim, (word_dim,))
    vectors, coverage = load_word_vectors(vocab, path, dims, seed=seed)
    words = len(vocab) - (1 if isinstance(vocab, Vocab) else 0)  # UNK is never looked up
    found = round(coverage * words)
    name = " + ".join(f"{d}d" for d in dims)
    print(
        f"glove {name}: vectors for {found} of {words} words ({100 * coverage:.1f}%); "
        f"{words - found} words without one get the usual random initialisation"
    )
    return vectors, {"dim": word_dim, "found": found, "missing": words - found}
