"""Universal Dependencies treebanks in CoNLL-U: sentences with a basic dependency tree.

:func:`read_conllu` and :func:`parse_conllu` read any CoNLL-U file or string into a list of
:class:`Sentence`. Only the basic tree is kept: multiword-token lines (IDs such as ``3-4``) and
empty nodes (IDs such as ``8.1``) are skipped, so a sentence's words are its syntactic words,
numbered ``1..n``. :func:`is_projective` tells whether a tree has crossing arcs.

UD English-EWT's splits and the index maps of a tagger or parser are in
:mod:`batchfold.data.ud`; the arc-hybrid transition system that parses these trees is in
:mod:`batchfold.models.transitions`.
"""

from __future__ import annotations

import gzip
import io
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TextIO, cast

import conllu
from conllu.exceptions import ParseException
from conllu.parser import DEFAULT_FIELD_PARSERS, DEFAULT_FIELDS, parse_line

from batchfold.data.paths import UNREADABLE, not_utf8
from batchfold.errors import ConlluFormatError

__all__ = [
    "ROOT",
    "ConlluFormatError",
    "Sentence",
    "base_relation",
    "is_projective",
    "parse_conllu",
    "read_conllu",
]

ROOT = 0
"""The index of the artificial root token; a HEAD of 0 attaches a word to it."""

_N_COLUMNS = 10


def _raw(fields: list[str], i: int) -> str:
    return fields[i]


# The columns nobody here reads are kept as plain strings, which halves the parsing time.
_FIELD_PARSERS = {name: _raw for name in ("lemma", "xpos", "feats", "deps", "misc")}


def base_relation(deprel: str) -> str:
    """The universal part of a dependency relation, without its subtype.

    Arguments:
        deprel: a relation such as ``"nmod:poss"`` or ``"obj"``.

    Returns:
        The part before the first ``:`` (the whole relation when there is none).

    Example:
        >>> base_relation("nmod:poss"), base_relation("obj")
        ('nmod', 'obj')
    """
    return deprel.split(":", 1)[0]


def is_projective(heads: Sequence[int], *, root_arc: bool = True) -> bool:
    """Whether a dependency tree has no crossing arcs, the arc from the root token included.

    The check is iterative (no recursion) and takes ``O(n log n)`` time: the arcs, seen as
    spans ``(min(h, d), max(h, d))`` with the root at position 0, must nest or be disjoint
    (sharing an end point is allowed). Counting the root arc makes a tree non-projective when
    an arc passes over the root word; such trees are out of reach of the arc-hybrid system
    wherever its root token sits. Some treebank statistics leave the root arc out (for
    UD English-EWT train, 280 non-projective sentences without it, 288 with it).

    Arguments:
        heads: ``heads[i]`` is the head of word ``i + 1``; 0 is the root token.
        root_arc: count the arcs from the root token; ``False`` checks the word-to-word arcs
            only.

    Returns:
        ``True`` when no two arcs cross.

    Raises:
        ValueError: a head is outside ``0..n`` or a word is its own head.

    Example:
        >>> is_projective([2, 0, 2])
        True
        >>> is_projective([3, 4, 0, 3])  # 1 <- 3 crosses 2 <- 4
        False
        >>> is_projective([3, 0, 2]), is_projective([3, 0, 2], root_arc=False)  # 1 <- 3 over 2
        (False, True)
    """
    n = len(heads)
    spans: list[tuple[int, int]] = []
    for dep, head in enumerate(heads, start=1):
        if not 0 <= head <= n or head == dep:
            raise ValueError(
                f"word {dep}: expected a head in 0..{n} other than {dep}, found {head}"
            )
        if head != ROOT or root_arc:
            spans.append((min(head, dep), -max(head, dep)))
    spans.sort()  # by left end, then widest first
    open_rights: list[int] = []  # right ends of the spans that enclose the current left end
    for left, neg_right in spans:
        right = -neg_right
        while open_rights and open_rights[-1] <= left:
            open_rights.pop()
        if open_rights and right > open_rights[-1]:
            return False
        open_rights.append(right)
    return True


@dataclass(frozen=True)
class Sentence:
    """One sentence of a treebank: its syntactic words with UPOS tags and a basic tree.

    Words are numbered from 1; ``heads[i]`` is the number of the head of word ``i + 1``, 0 for
    the root. Lists given to the constructor are stored as tuples.

    Arguments:
        words: the word forms (multiword tokens are split into their syntactic words).
        upos: one universal POS tag per word.
        heads: one head per word, in ``0..n``.
        deprels: one dependency relation per word, with its subtype (``"nmod:poss"``).
        sent_id: the ``# sent_id`` comment, or ``""`` when the sentence has none.

    Raises:
        ValueError: the four sequences differ in length.

    Example:
        >>> s = Sentence(("I", "ran"), ("PRON", "VERB"), (2, 0), ("nsubj", "root"), "s1")
        >>> len(s), s.is_projective, s.base_deprels
        (2, True, ('nsubj', 'root'))
    """

    words: tuple[str, ...]
    upos: tuple[str, ...]
    heads: tuple[int, ...]
    deprels: tuple[str, ...]
    sent_id: str = ""

    def __post_init__(self) -> None:
        for name in ("words", "upos", "heads", "deprels"):
            value = getattr(self, name)
            if not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))
        lengths = {len(self.words), len(self.upos), len(self.heads), len(self.deprels)}
        if len(lengths) != 1:
            raise ValueError(
                f"sentence {self.sent_id!r}: expected as many UPOS tags, heads and relations as "
                f"words ({len(self.words)}), found {len(self.upos)}, {len(self.heads)} and "
                f"{len(self.deprels)}"
            )

    def __len__(self) -> int:
        return len(self.words)

    @property
    def is_projective(self) -> bool:
        """Whether the tree has no crossing arcs (see :func:`is_projective`).

        Returns:
            ``True`` for a projective tree.

        Example:
            >>> Sentence(("a", "b", "c", "d"), ("X",) * 4, (3, 4, 0, 3), ("dep",) * 4).is_projective
            False
        """
        return is_projective(self.heads)

    @property
    def base_deprels(self) -> tuple[str, ...]:
        """The relations without their subtypes (see :func:`base_relation`).

        Returns:
            One base relation per word.

        Example:
            >>> Sentence(("my", "dog"), ("PRON", "NOUN"), (2, 0), ("nmod:poss", "root")).base_deprels
            ('nmod', 'root')
        """
        return tuple(base_relation(d) for d in self.deprels)


# ----------------------------------------------------------------------------------------------
# Reading CoNLL-U


class _LineTracker:
    """Feeds lines to ``conllu.parse_incr`` and remembers the current sentence's lines."""

    def __init__(self, lines: Iterable[str]) -> None:
        self._lines = lines
        self.line_no = 0
        self.block: list[tuple[int, str]] = []
        self._ended = True

    def read(self, size: int = -1) -> str:  # parse_incr only checks that this exists
        raise io.UnsupportedOperation("iterate over the lines instead")

    def __iter__(self) -> Iterator[str]:
        for line in self._lines:
            self.line_no += 1
            if not line.strip():
                self._ended = True
            else:
                if self._ended:
                    self.block = []
                    self._ended = False
                self.block.append((self.line_no, line.rstrip("\r\n")))
            yield line


def _block_sent_id(block: list[tuple[int, str]]) -> str:
    for _, text in block:
        if text.lstrip().startswith("#"):
            key, _, value = text.lstrip()[1:].partition("=")
            if key.strip() == "sent_id":
                return value.strip()
    return ""


def _iter_sentences(lines: Iterable[str], source: str) -> Iterator[Sentence]:
    tracker = _LineTracker(lines)
    parsed = conllu.parse_incr(cast(TextIO, tracker), field_parsers=_FIELD_PARSERS)
    index = 0
    while True:
        try:
            tokens = next(parsed)
        except StopIteration:
            return
        except ParseException as err:
            raise _locate_parse_error(tracker.block, source, index + 1, err) from None
        index += 1
        yield _to_sentence(tokens, tracker.block, source, index)


def _locate_parse_error(
    block: list[tuple[int, str]], source: str, index: int, err: ParseException
) -> ConlluFormatError:
    sent_id = _block_sent_id(block)
    name = repr(sent_id) if sent_id else f"#{index}"
    parsers = {**DEFAULT_FIELD_PARSERS, **_FIELD_PARSERS}
    for line_no, text in block:
        if text.lstrip().startswith("#"):
            continue
        try:
            parse_line(text.strip(), DEFAULT_FIELDS, parsers)
        except ParseException as line_err:
            return ConlluFormatError(
                f"{source}:{line_no}: sentence {name}: expected a word line of {_N_COLUMNS} "
                f"tab-separated columns with integer ID and HEAD, found {text!r} ({line_err})"
            )
    first = block[0][0] if block else 0
    return ConlluFormatError(f"{source}:{first}: sentence {name}: {err}")


def _to_sentence(
    tokens: conllu.TokenList, block: list[tuple[int, str]], source: str, index: int
) -> Sentence:
    sent_id = str(tokens.metadata.get("sent_id") or "")
    name = repr(sent_id) if sent_id else f"#{index}"
    word_lines = [(no, text) for no, text in block if not text.lstrip().startswith("#")]
    first_line = block[0][0] if block else 0

    def fail(line_no: int, message: str) -> ConlluFormatError:
        return ConlluFormatError(f"{source}:{line_no}: sentence {name}: {message}")

    words: list[str] = []
    upos: list[str] = []
    heads: list[int | None] = []
    deprels: list[str] = []
    lines: list[int] = []
    for token, (line_no, text) in zip(tokens, word_lines, strict=True):
        n_columns = len(text.split("\t"))
        if n_columns != _N_COLUMNS:
            raise fail(line_no, f"expected {_N_COLUMNS} tab-separated columns, found {n_columns}")
        token_id = token["id"]
        if isinstance(token_id, tuple):  # a multiword token (3-4) or an empty node (8.1)
            continue
        expected = len(words) + 1
        if token_id != expected:
            found = "_" if token_id is None else token_id
            raise fail(line_no, f"expected word ID {expected}, found {found}")
        for column in ("upos", "deprel"):
            if token[column] in ("_", ""):
                raise fail(line_no, f"expected a {column.upper()} for word {expected}, found '_'")
        words.append(str(token["form"]))
        upos.append(str(token["upos"]))
        heads.append(token["head"])
        deprels.append(str(token["deprel"]))
        lines.append(line_no)
    n = len(words)
    if n == 0:
        raise fail(first_line, "expected at least one word line, found none")
    checked: list[int] = []
    for head, line_no in zip(heads, lines, strict=True):
        if head is None or not 0 <= head <= n:
            raise fail(line_no, f"expected a HEAD in 0..{n}, found {'_' if head is None else head}")
        checked.append(head)
    roots = [i for i, head in enumerate(checked) if head == ROOT]
    if len(roots) != 1:
        where = lines[roots[1]] if len(roots) > 1 else first_line
        raise fail(where, f"expected exactly one root (HEAD 0), found {len(roots)}")
    cycle = _find_cycle(checked)
    if cycle is not None:
        raise fail(
            lines[cycle - 1],
            f"expected every word to lead to the root, found a cycle through word {cycle}",
        )
    return Sentence(tuple(words), tuple(upos), tuple(checked), tuple(deprels), sent_id)


def _find_cycle(heads: Sequence[int]) -> int | None:
    """The first word whose chain of heads loops without reaching the root, else ``None``."""
    state = [0] * (len(heads) + 1)  # 0 unseen, 1 on the current path, 2 known to reach root
    state[ROOT] = 2
    for start in range(1, len(heads) + 1):
        path = []
        word = start
        while state[word] == 0:
            state[word] = 1
            path.append(word)
            word = heads[word - 1]
        if state[word] == 1:
            return word
        for w in path:
            state[w] = 2
    return None


def parse_conllu(text: str, *, source: str = "<string>") -> list[Sentence]:
    """Read CoNLL-U text into sentences (multiword tokens and empty nodes are skipped).

    Arguments:
        text: the CoNLL-U text, sentences separated by blank lines.
        source: the name used for the text in error messages.

    Returns:
        The sentences in order.

    Raises:
        ConlluFormatError: a line does not have 10 columns, word IDs do not run ``1..n``, a
            HEAD is outside ``0..n``, a sentence does not have exactly one root, or the heads
            form a cycle.

    Example:
        >>> text = (
        ...     "# sent_id = s1\\n"
        ...     "1-2\\tdon't\\t_\\t_\\t_\\t_\\t_\\t_\\t_\\t_\\n"
        ...     "1\\tdo\\tdo\\tAUX\\t_\\t_\\t3\\taux\\t_\\t_\\n"
        ...     "2\\tn't\\tnot\\tPART\\t_\\t_\\t3\\tadvmod\\t_\\t_\\n"
        ...     "3\\tgo\\tgo\\tVERB\\t_\\t_\\t0\\troot\\t_\\t_\\n"
        ... )
        >>> [(s.sent_id, s.words, s.heads) for s in parse_conllu(text)]
        [('s1', ('do', "n't", 'go'), (3, 3, 0))]
    """
    return list(_iter_sentences(io.StringIO(text), source))


def _open_text(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open(encoding="utf-8")


def read_conllu(path: str | os.PathLike[str]) -> list[Sentence]:
    """Read a CoNLL-U file, plain or gzipped (``.gz``), into sentences.

    Arguments:
        path: the file.

    Returns:
        The sentences in order; see :func:`parse_conllu`.

    Raises:
        FileNotFoundError: the file does not exist.
        ConlluFormatError: the file is malformed; the message names the file and line.

    Example:
        >>> import tempfile, pathlib
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     f = pathlib.Path(tmp) / "one.conllu"
        ...     _ = f.write_text("1\\tHi\\thi\\tINTJ\\t_\\t_\\t0\\troot\\t_\\t_\\n\\n")
        ...     read_conllu(f)[0].words
        ('Hi',)
    """
    path = Path(path)
    with _open_text(path) as lines:
        try:
            return list(_iter_sentences(lines, str(path)))
        except UNREADABLE as error:
            raise not_utf8(path, error) from None
