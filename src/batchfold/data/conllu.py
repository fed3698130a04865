"""Universal Dependencies treebanks in CoNLL-U, for a POS tagger and an arc-hybrid parser.

:func:`load_ud` reads one split of UD English-EWT (``en_ewt-ud-{train,dev,test}.conllu``, plain
or gzipped) into a list of :class:`Sentence`; :func:`read_conllu` and :func:`parse_conllu` read
any CoNLL-U file or string. Only the basic tree is kept: multiword-token lines (IDs such as
``3-4``) and empty nodes (IDs such as ``8.1``) are skipped, so a sentence's words are its
syntactic words, numbered ``1..n``.

For parsing, :class:`ArcHybrid` is the arc-hybrid transition system (Kuhlmann, Gomez-Rodriguez
and Satta 2011) as used by Kiperwasser and Goldberg (2016). The artificial root token ``0``
sits at the **end of the buffer**: a configuration starts with an empty stack and the buffer
``1 .. n, 0``, and it is terminal when the stack is empty and only the root is left in the
buffer. The root is never shifted; words get attached to it by LEFT_ARC when it is the first
buffer item. :func:`oracle_transitions` is the static oracle and :func:`action_cost` the
dynamic oracle of Goldberg and Nivre (2013). :func:`attachment_scores` computes UAS and LAS.

:func:`build_vocabs` makes the index maps a tagger or parser needs (words, characters, UPOS
tags, dependency relations).
"""

from __future__ import annotations

import enum
import gzip
import io
import os
import shutil
import urllib.request
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal, TextIO, TypeAlias, cast

import conllu
from conllu.exceptions import ParseException
from conllu.parser import DEFAULT_FIELD_PARSERS, DEFAULT_FIELDS, parse_line

from batchfold.data.paths import data_roots, find_data
from batchfold.data.vocab import Vocab
from batchfold.errors import BatchfoldError

__all__ = [
    "ROOT",
    "UD_EWT_REPO",
    "UD_EWT_URL",
    "Action",
    "ArcHybrid",
    "ConlluFormatError",
    "LabelSet",
    "Sentence",
    "Split",
    "Transition",
    "UDVocabs",
    "action_cost",
    "attachment_scores",
    "base_relation",
    "build_vocabs",
    "cache_dir",
    "download_ud",
    "is_projective",
    "load_ud",
    "oracle_transitions",
    "parse_conllu",
    "read_conllu",
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

ROOT = 0
"""The index of the artificial root token; a HEAD of 0 attaches a word to it."""

_SPLITS = ("train", "dev", "test")
_DATA_NAME = "ud-ewt"
_N_COLUMNS = 10


def _raw(fields: list[str], i: int) -> str:
    return fields[i]


# The columns nobody here reads are kept as plain strings, which halves the parsing time.
_FIELD_PARSERS = {name: _raw for name in ("lemma", "xpos", "feats", "deps", "misc")}


class ConlluFormatError(BatchfoldError, ValueError):
    """A CoNLL-U file or string does not hold well-formed basic dependency trees.

    The message reads ``file:line: sentence 'id': expected ..., found ...``.

    Example:
        >>> try:
        ...     parse_conllu("1\\tHi\\thi\\tINTJ\\t_\\t_\\t2\\troot\\t_\\t_\\n", source="x.conllu")
        ... except ConlluFormatError as err:
        ...     print(err)
        x.conllu:1: sentence #1: expected a HEAD in 0..1, found 2
    """


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
        return list(_iter_sentences(lines, str(path)))


# ----------------------------------------------------------------------------------------------
# Finding and downloading UD English-EWT


def cache_dir() -> Path:
    """The folder that downloaded EWT files are kept in.

    Returns:
        ``$BATCHFOLD_CACHE/ud-ewt`` when that variable is set, else
        ``~/.cache/batchfold/ud-ewt``.

    Example:
        >>> cache_dir().name
        'ud-ewt'
    """
    root = os.environ.get("BATCHFOLD_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "batchfold"
    return base / _DATA_NAME


def download_ud(split: Split, folder: str | os.PathLike[str] | None = None) -> Path:
    """Download the raw CoNLL-U file of one EWT split from GitHub.

    The file is written under a temporary name and renamed when complete, so an interrupted
    download leaves nothing that looks finished.

    Arguments:
        split: ``"train"``, ``"dev"`` or ``"test"``.
        folder: where to put it; :func:`cache_dir` when ``None``.

    Returns:
        The path of ``en_ewt-ud-{split}.conllu``.

    Raises:
        ValueError: ``split`` is not one of the three names.
        OSError: the download failed (no network, HTTP error, ...).
    """
    _check_split(split)
    target_dir = Path(folder) if folder is not None else cache_dir()
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
    then in :func:`cache_dir`. When English-EWT is still missing and no ``path`` was given, it
    is downloaded into :func:`cache_dir` (see :func:`download_ud`).

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
        folders.append(cache_dir())
    for folder in folders:
        for name in names:
            if (folder / name).is_file():
                return read_conllu(folder / name)
    reason = ""
    if path is None and treebank == "en_ewt":
        try:
            return read_conllu(download_ud(split, cache_dir()))
        except OSError as err:
            reason = f" Downloading {UD_EWT_URL.format(split=split)} failed: {err}."
    if path is not None:
        looked = [Path(path)]
    else:
        looked = [root / _DATA_NAME for root in data_roots()] + [cache_dir()]
    raise FileNotFoundError(
        f"{stem} (or {stem}.gz) was not found; looked in {', '.join(map(str, looked))}."
        f"{reason} Get UD English-EWT from {UD_EWT_REPO} (release files "
        f"en_ewt-ud-{{train,dev,test}}.conllu), put them in a folder and pass it as path=, "
        f"or put them in a folder named {_DATA_NAME} under $BATCHFOLD_DATA."
    )


# ----------------------------------------------------------------------------------------------
# The arc-hybrid transition system


class Action(enum.IntEnum):
    """The three arc-hybrid transitions.

    SHIFT moves the first buffer item onto the stack. LEFT_ARC attaches the stack top to the
    first buffer item and pops it. RIGHT_ARC attaches the stack top to the item below it and
    pops it.
    """

    SHIFT = 0
    LEFT_ARC = 1
    RIGHT_ARC = 2


Transition: TypeAlias = tuple[Action, str | None]
"""An action with its relation label (``None`` for SHIFT, or for unlabelled parsing)."""


class ArcHybrid:
    """An arc-hybrid parser configuration: a stack, a buffer and the arcs built so far.

    Words are numbered ``1..n`` and the root token is :data:`ROOT` (0), kept at the end of
    the buffer and never shifted. A configuration starts with an empty stack and the buffer
    ``1..n, 0``; it is terminal when the stack is empty and the buffer holds only the root.
    Every word then has a head, but nothing stops several words from being attached to the
    root (the static oracle of a single-rooted tree attaches exactly one).

    Arguments:
        n_words: the number of words of the sentence.

    Raises:
        ValueError: ``n_words`` is negative.

    Example:
        >>> c = ArcHybrid(2)
        >>> c.apply(Action.SHIFT)
        >>> c.apply(Action.LEFT_ARC, "nsubj")  # 1 <- 2
        >>> c.apply(Action.SHIFT)
        >>> c.stack, c.buffer
        ([2], [0])
        >>> c.apply(Action.LEFT_ARC, "root")  # 2 <- root
        >>> c.is_terminal(), c.heads, c.arcs
        (True, [2, 0], [(2, 1, 'nsubj'), (0, 2, 'root')])
    """

    __slots__ = ("heads", "labels", "n_words", "next", "stack")

    def __init__(self, n_words: int) -> None:
        if n_words < 0:
            raise ValueError(f"expected a word count of at least 0, found {n_words}")
        self.n_words = n_words
        """The number of words."""
        self.stack: list[int] = []
        """The stack, bottom first (``stack[-1]`` is the top)."""
        self.next = 1
        """The first word still in the buffer; ``n_words + 1`` when only the root is left."""
        self.heads: list[int] = [-1] * n_words
        """``heads[i]`` is the head given to word ``i + 1``, or -1 while it has none."""
        self.labels: list[str | None] = [None] * n_words
        """``labels[i]`` is the relation given with word ``i + 1``'s head."""

    @property
    def buffer(self) -> list[int]:
        """The buffer, first item first; it always ends with the root.

        Returns:
            A new list ``[next, ..., n, 0]``.

        Example:
            >>> ArcHybrid(3).buffer
            [1, 2, 3, 0]
        """
        return [*range(self.next, self.n_words + 1), ROOT]

    @property
    def b0(self) -> int:
        """The first buffer item (the root when no word is left).

        Returns:
            A word number, or :data:`ROOT`.

        Example:
            >>> ArcHybrid(0).b0
            0
        """
        return self.next if self.next <= self.n_words else ROOT

    @property
    def arcs(self) -> list[tuple[int, int, str | None]]:
        """The arcs built so far as ``(head, dependent, label)``, in order of dependents.

        Returns:
            A new list.

        Example:
            >>> ArcHybrid(1).arcs
            []
        """
        return [
            (head, dep, self.labels[dep - 1])
            for dep, head in enumerate(self.heads, start=1)
            if head >= 0
        ]

    def copy(self) -> ArcHybrid:
        """An independent copy of this configuration.

        Returns:
            A configuration with equal but separate stack and arcs.

        Example:
            >>> c = ArcHybrid(1)
            >>> d = c.copy(); d.apply(Action.SHIFT)
            >>> c.stack, d.stack
            ([], [1])
        """
        other = ArcHybrid.__new__(ArcHybrid)
        other.n_words = self.n_words
        other.stack = list(self.stack)
        other.next = self.next
        other.heads = list(self.heads)
        other.labels = list(self.labels)
        return other

    def is_terminal(self) -> bool:
        """Whether parsing is over: the stack is empty and only the root is in the buffer.

        Returns:
            ``True`` for a terminal configuration.

        Example:
            >>> ArcHybrid(0).is_terminal(), ArcHybrid(1).is_terminal()
            (True, False)
        """
        return not self.stack and self.next > self.n_words

    def is_legal(self, action: Action) -> bool:
        """Whether ``action`` can be applied now.

        SHIFT needs a word (not the root) at the front of the buffer; LEFT_ARC needs a
        non-empty stack; RIGHT_ARC needs at least two items on the stack.

        Arguments:
            action: the transition.

        Returns:
            ``True`` when it is allowed.

        Example:
            >>> c = ArcHybrid(1)
            >>> [c.is_legal(a) for a in Action]
            [True, False, False]
        """
        if action is Action.SHIFT:
            return self.next <= self.n_words
        if action is Action.LEFT_ARC:
            return bool(self.stack)
        return len(self.stack) >= 2

    def legal_actions(self) -> list[Action]:
        """The actions allowed now, in the order SHIFT, LEFT_ARC, RIGHT_ARC.

        Returns:
            A list, empty only for a terminal configuration.

        Example:
            >>> ArcHybrid(1).legal_actions()
            [<Action.SHIFT: 0>]
        """
        return [a for a in Action if self.is_legal(a)]

    def apply(self, action: Action, label: str | None = None) -> None:
        """Apply a transition in place.

        Arguments:
            action: the transition.
            label: the relation of the new arc (ignored for SHIFT).

        Raises:
            ValueError: the action is not legal in this configuration.

        Example:
            >>> c = ArcHybrid(1); c.apply(Action.RIGHT_ARC)
            Traceback (most recent call last):
            ...
            ValueError: RIGHT_ARC is not legal here: expected at least 2 items on the stack, found 0
        """
        if not self.is_legal(action):
            needs = {
                Action.SHIFT: "a word at the front of the buffer, found only the root",
                Action.LEFT_ARC: "a non-empty stack, found an empty one",
                Action.RIGHT_ARC: f"at least 2 items on the stack, found {len(self.stack)}",
            }[action]
            raise ValueError(f"{action.name} is not legal here: expected {needs}")
        if action is Action.SHIFT:
            self.stack.append(self.next)
            self.next += 1
            return
        dep = self.stack.pop()
        head = self.b0 if action is Action.LEFT_ARC else self.stack[-1]
        self.heads[dep - 1] = head
        self.labels[dep - 1] = label

    def __repr__(self) -> str:
        return f"ArcHybrid(stack={self.stack}, buffer={self.buffer}, arcs={len(self.arcs)})"


def _gold_children_counts(heads: Sequence[int]) -> list[int]:
    counts = [0] * (len(heads) + 1)
    for head in heads:
        counts[head] += 1
    return counts


def oracle_transitions(sentence: Sentence) -> list[Transition]:
    """The static oracle: the arc-hybrid transitions that build a projective gold tree.

    At each step the oracle attaches the stack top with LEFT_ARC when its gold head is the
    first buffer item, or with RIGHT_ARC when it is the item below it on the stack, once the
    stack top has all its dependents; otherwise it shifts.

    Arguments:
        sentence: a sentence with a projective tree.

    Returns:
        ``(action, label)`` pairs; applying them to ``ArcHybrid(len(sentence))`` reproduces
        ``sentence.heads`` and ``sentence.deprels``. The label of SHIFT is ``None``.

    Raises:
        ValueError: the tree is not projective.

    Example:
        >>> s = Sentence(("I", "ran", "home"), ("PRON", "VERB", "ADV"), (2, 0, 2),
        ...              ("nsubj", "root", "advmod"))
        >>> [(a.name, l) for a, l in oracle_transitions(s)]  # doctest: +NORMALIZE_WHITESPACE
        [('SHIFT', None), ('LEFT_ARC', 'nsubj'), ('SHIFT', None), ('SHIFT', None),
         ('RIGHT_ARC', 'advmod'), ('LEFT_ARC', 'root')]
    """
    heads = sentence.heads
    if not is_projective(heads):
        raise ValueError(
            f"sentence {sentence.sent_id!r}: expected a projective tree for the arc-hybrid "
            "static oracle, found crossing arcs"
        )
    missing = _gold_children_counts(heads)  # dependents not attached yet, per word
    config = ArcHybrid(len(heads))
    transitions: list[Transition] = []
    while not config.is_terminal():
        action = Action.SHIFT
        if config.stack:
            s0 = config.stack[-1]
            head = heads[s0 - 1]
            if missing[s0] == 0:
                if head == config.b0:
                    action = Action.LEFT_ARC
                elif len(config.stack) >= 2 and head == config.stack[-2]:
                    action = Action.RIGHT_ARC
        if action is Action.SHIFT:
            transitions.append((action, None))
        else:
            label = sentence.deprels[config.stack[-1] - 1]
            missing[heads[config.stack[-1] - 1]] -= 1
            transitions.append((action, label))
        config.apply(*transitions[-1])
    return transitions


def action_cost(
    config: ArcHybrid,
    action: Action,
    gold_heads: Sequence[int],
    *,
    label: str | None = None,
    gold_labels: Sequence[str] | None = None,
) -> int:
    """The dynamic-oracle cost of an arc-hybrid action (Goldberg and Nivre 2013).

    The cost is the number of gold arcs that can still be built before the action and can no
    longer be built after it. With ``s0``, ``s1`` the two top stack items, ``b`` the first
    buffer item and ``B`` the whole buffer (root included):

    * LEFT_ARC loses the gold arcs from ``s0`` to words in ``B`` and ``s0``'s gold head
      when that is ``s1`` or in ``B`` other than ``b``;
    * RIGHT_ARC loses the gold arcs from ``s0`` to words in ``B`` and ``s0``'s gold head
      when that is in ``B``;
    * SHIFT loses the gold arcs between ``b`` and the stack, except an arc from ``s0`` to
      ``b``.

    For a projective gold tree this is exact (arc-hybrid is arc-decomposable): an action
    has cost 0 exactly when the best tree still reachable stays reachable. For a
    non-projective gold tree (see :func:`is_projective`) not all gold arcs can be built
    together, and the count, which looks at each arc on its own, is only an approximation.

    Arguments:
        config: the current configuration.
        action: a legal action.
        gold_heads: the gold head of each word (``gold_heads[i]`` for word ``i + 1``).
        label: the relation the action would give its arc.
        gold_labels: the gold relations; with ``label``, an arc with the right head but the
            wrong relation costs 1 more.

    Returns:
        The number of gold arcs lost, at least 0.

    Raises:
        ValueError: the action is illegal, or ``gold_heads`` does not have one head per word.

    Example:
        >>> c = ArcHybrid(2); c.apply(Action.SHIFT)  # stack [1], buffer [2, 0]
        >>> gold = [2, 0]
        >>> [action_cost(c, a, gold) for a in (Action.SHIFT, Action.LEFT_ARC)]
        [1, 0]
    """
    if len(gold_heads) != config.n_words:
        raise ValueError(
            f"expected {config.n_words} gold heads (one per word), found {len(gold_heads)}"
        )
    if not config.is_legal(action):
        raise ValueError(f"{action.name} is not legal in {config!r}")
    stack = config.stack
    first = config.next  # words first..n are in the buffer, followed by the root

    def in_buffer(item: int) -> bool:
        return item == ROOT or item >= first

    def buffer_dependents(head: int) -> int:
        return sum(1 for h in gold_heads[first - 1 :] if h == head)

    if action is Action.SHIFT:
        b = first
        gold = gold_heads[b - 1]
        cost = sum(1 for item in stack if gold_heads[item - 1] == b)
        if gold != ROOT and gold in stack[:-1]:
            cost += 1
        return cost
    s0 = stack[-1]
    gold = gold_heads[s0 - 1]
    cost = buffer_dependents(s0)
    if action is Action.LEFT_ARC:
        b = config.b0
        if gold != b and ((len(stack) >= 2 and gold == stack[-2]) or in_buffer(gold)):
            cost += 1
        attached_to = b
    else:
        if in_buffer(gold):
            cost += 1
        attached_to = stack[-2]
    if (
        gold == attached_to
        and label is not None
        and gold_labels is not None
        and label != gold_labels[s0 - 1]
    ):
        cost += 1
    return cost


def attachment_scores(
    pred_heads: Sequence[Sequence[int]],
    pred_labels: Sequence[Sequence[str | None]],
    gold: Sequence[Sentence],
    *,
    subtypes: bool = True,
) -> tuple[float, float]:
    """Unlabelled and labelled attachment scores over a corpus, micro-averaged over words.

    Every word counts, punctuation included. UAS is the share of words with the right head;
    LAS the share with the right head and the right relation. Relations are compared in full
    (``nmod:poss`` differs from ``nmod``) unless ``subtypes`` is ``False``.

    Arguments:
        pred_heads: predicted heads, one sequence per sentence.
        pred_labels: predicted relations, one sequence per sentence.
        gold: the gold sentences.
        subtypes: compare relation subtypes too.

    Returns:
        ``(uas, las)``, fractions in ``[0, 1]``.

    Raises:
        ValueError: the numbers of sentences or of words differ, or there are no words.

    Example:
        >>> g = Sentence(("I", "ran", "home"), ("PRON", "VERB", "ADV"), (2, 0, 2),
        ...              ("nsubj", "root", "obj"))
        >>> attachment_scores([(2, 0, 2)], [("nsubj", "root", "advmod")], [g])
        (1.0, 0.6666666666666666)
    """
    if not len(pred_heads) == len(pred_labels) == len(gold):
        raise ValueError(
            f"expected as many predicted head and label sequences as gold sentences "
            f"({len(gold)}), found {len(pred_heads)} and {len(pred_labels)}"
        )
    total = right_heads = right_both = 0
    for k, (heads, labels, sentence) in enumerate(zip(pred_heads, pred_labels, gold, strict=True)):
        n = len(sentence)
        if len(heads) != n or len(labels) != n:
            raise ValueError(
                f"sentence {k} ({sentence.sent_id!r}): expected {n} predicted heads and "
                f"labels, found {len(heads)} and {len(labels)}"
            )
        total += n
        for head, label, gold_head, gold_label in zip(
            heads, labels, sentence.heads, sentence.deprels, strict=True
        ):
            if head != gold_head:
                continue
            right_heads += 1
            if label is not None and (
                label == gold_label
                if subtypes
                else base_relation(label) == base_relation(gold_label)
            ):
                right_both += 1
    if total == 0:
        raise ValueError("expected at least one word to score, found none")
    return right_heads / total, right_both / total


# ----------------------------------------------------------------------------------------------
# Vocabularies


class LabelSet:
    """A closed set of labels (UPOS tags, relations) numbered ``0..len - 1``, without unknowns.

    Arguments:
        labels: the labels, in id order; repeats are not allowed.

    Raises:
        ValueError: a label is repeated.

    Example:
        >>> tags = LabelSet(["NOUN", "VERB"])
        >>> tags.encode(["VERB", "NOUN"]), tags.decode([1]), len(tags)
        ([1, 0], ['VERB'], 2)
    """

    __slots__ = ("_ids", "labels")

    def __init__(self, labels: Iterable[str]) -> None:
        self.labels: tuple[str, ...] = tuple(labels)
        """The labels in id order."""
        self._ids = {label: i for i, label in enumerate(self.labels)}
        if len(self._ids) != len(self.labels):
            repeated = next(x for x, c in Counter(self.labels).items() if c > 1)
            raise ValueError(f"expected distinct labels, found {repeated!r} twice")

    def index(self, label: str) -> int:
        """The id of a label.

        Arguments:
            label: a label of the set.

        Returns:
            Its id.

        Raises:
            KeyError: the label is not in the set.

        Example:
            >>> LabelSet(["a", "b"]).index("b")
            1
        """
        try:
            return self._ids[label]
        except KeyError:
            raise KeyError(
                f"expected one of the {len(self.labels)} known labels, found {label!r}"
            ) from None

    def encode(self, labels: Iterable[str]) -> list[int]:
        """The ids of a sequence of labels.

        Arguments:
            labels: labels of the set.

        Returns:
            One id per label.

        Raises:
            KeyError: a label is not in the set.

        Example:
            >>> LabelSet(["a", "b"]).encode("ba")
            [1, 0]
        """
        return [self.index(label) for label in labels]

    def decode(self, ids: Iterable[int]) -> list[str]:
        """The labels of a sequence of ids.

        Arguments:
            ids: ids in ``0..len - 1``.

        Returns:
            One label per id.

        Example:
            >>> LabelSet(["a", "b"]).decode([0, 1, 1])
            ['a', 'b', 'b']
        """
        return [self.labels[i] for i in ids]

    def __len__(self) -> int:
        return len(self.labels)

    def __contains__(self, label: object) -> bool:
        return label in self._ids

    def __iter__(self) -> Iterator[str]:
        return iter(self.labels)

    def __repr__(self) -> str:
        return f"LabelSet({list(self.labels)!r})"


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
