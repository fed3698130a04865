"""Index maps: a word vocabulary (id 0 for unknown words) and a closed set of labels.

:class:`Vocab` maps words to integer ids, with id 0 reserved for unknown words;
:class:`LabelSet` numbers a closed set of labels (UPOS tags, relations), with no unknown entry.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator

__all__ = ["UNK", "LabelSet", "Vocab"]

UNK = "<unk>"
"""The word that stands for every word not in a vocabulary; its id is always 0."""


class Vocab:
    """Words mapped to ids ``0 .. len(vocab) - 1``, where id 0 is :data:`UNK`.

    Words are numbered by descending count; words with equal counts keep the order in which
    they were first seen. Words seen fewer than ``min_count`` times are left out (they map to
    id 0). A :data:`UNK` in the input is not added twice.

    Arguments:
        words: the words of a corpus, with repeats (for example every token of the training
            sentences).
        min_count: the fewest times a word must occur to get its own id.

    Raises:
        ValueError: ``min_count`` is below 1.

    Example:
        >>> v = Vocab("the cat saw the dog".split())
        >>> len(v), v["the"], v["cat"], v["zebra"], v.words
        (5, 1, 2, 0, ['<unk>', 'the', 'cat', 'saw', 'dog'])
        >>> Vocab("a b a c a b".split(), min_count=2).words
        ['<unk>', 'a', 'b']
    """

    __slots__ = ("_ids", "_words")

    unk_id = 0
    """The id of :data:`UNK` and of every unknown word."""

    def __init__(self, words: Iterable[str] = (), *, min_count: int = 1) -> None:
        if min_count < 1:
            raise ValueError(f"min_count must be at least 1, got {min_count}")
        counts = Counter(words)
        counts.pop(UNK, None)
        kept = [word for word, count in counts.most_common() if count >= min_count]
        self._set_words([UNK, *kept])

    def _set_words(self, words: list[str]) -> None:
        self._words = words
        self._ids = {word: i for i, word in enumerate(words)}

    @classmethod
    def from_state_dict(cls, state: list[str]) -> Vocab:
        """Rebuild a vocabulary from :meth:`state_dict`'s list of words.

        Arguments:
            state: the words in id order, starting with :data:`UNK`.

        Returns:
            A vocabulary with exactly those ids.

        Raises:
            ValueError: the list does not start with :data:`UNK`, or repeats a word.

        Example:
            >>> Vocab.from_state_dict(["<unk>", "b", "a"])["a"]
            2
        """
        words = list(state)
        if not words or words[0] != UNK:
            first = repr(words[0]) if words else "an empty list"
            raise ValueError(f"a vocabulary state must start with {UNK!r}, found {first}")
        if len(set(words)) != len(words):
            repeated = next(w for w, c in Counter(words).items() if c > 1)
            raise ValueError(f"a vocabulary state repeats the word {repeated!r}")
        vocab = cls.__new__(cls)
        vocab._set_words(words)
        return vocab

    def state_dict(self) -> list[str]:
        """The vocabulary as a plain list of words in id order, for checkpoints.

        Returns:
            A copy of :attr:`words`; :meth:`from_state_dict` turns it back into a vocabulary.

        Example:
            >>> Vocab(["x", "y", "y"]).state_dict()
            ['<unk>', 'y', 'x']
        """
        return list(self._words)

    @property
    def words(self) -> list[str]:
        """The words in id order (``words[i]`` has id ``i``); the first is :data:`UNK`.

        Returns:
            The word list (do not modify it).

        Example:
            >>> Vocab(["hi"]).words
            ['<unk>', 'hi']
        """
        return self._words

    def lookup(self, word: str) -> int:
        """The id of ``word``, or 0 (:data:`UNK`'s id) when it is not in the vocabulary.

        Arguments:
            word: any word.

        Returns:
            Its id.

        Example:
            >>> v = Vocab(["hi"])
            >>> v.lookup("hi"), v.lookup("bye")
            (1, 0)
        """
        return self._ids.get(word, 0)

    def encode(self, words: Iterable[str]) -> list[int]:
        """The ids of a sequence of words, unknown words giving 0.

        Arguments:
            words: the words, such as a sentence's tokens.

        Returns:
            One id per word.

        Example:
            >>> Vocab("a b".split()).encode("b a c".split())
            [2, 1, 0]
        """
        ids = self._ids
        return [ids.get(word, 0) for word in words]

    def __getitem__(self, word: str) -> int:
        return self._ids.get(word, 0)

    def __contains__(self, word: object) -> bool:
        return word in self._ids

    def __len__(self) -> int:
        return len(self._words)

    def __iter__(self) -> Iterator[str]:
        return iter(self._words)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Vocab):
            return NotImplemented
        return self._words == other._words

    def __repr__(self) -> str:
        shown = ", ".join(repr(w) for w in self._words[:5])
        more = ", ..." if len(self._words) > 5 else ""
        return f"Vocab({len(self._words)} words: [{shown}{more}])"

    def __getstate__(self) -> list[str]:
        return self._words

    def __setstate__(self, state: list[str]) -> None:
        self._set_words(list(state))


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
