"""What the BiLSTM tagger and the BiLSTM parser share: LSTM steps, a BiLSTM, word dropout.

:class:`BiLSTM` steps each direction one position at a time with a
:func:`batchfold.function`-wrapped :class:`LSTMStep`, so that inside
:func:`batchfold.batch_map` every step is one graph node, batched with the same step of every
other sentence. :class:`WordDropoutModel` is the base of the two models
(:class:`~batchfold.models.tagger.BiLSTMTagger`,
:class:`~batchfold.models.parser.ArcHybridParser`): it keeps the index maps and reads word ids
with word dropout; it has no parameters of its own.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch
from torch import Tensor, nn

import batchfold as bf
from batchfold.data.conllu import Sentence
from batchfold.data.ud import UDVocabs
from batchfold.lazy import BatchedFunction

__all__ = [
    "BiLSTM",
    "ConcatLinear",
    "LSTMStep",
    "State",
    "TaggedWordsModel",
    "WordDropoutModel",
    "check_sizes",
    "unk_probabilities",
]

State = tuple[Tensor, Tensor]
"""An LSTM state ``(h, c)``."""


class LSTMStep(nn.Module):
    """One LSTM step on the concatenation of its input pieces.

    Taking the pieces apart (a word vector and two character states, or the two directions
    of the layer below) saves a concatenation node per position inside ``batch_map``.

    Arguments:
        in_dim: the total size of the input pieces.
        hidden: the size of ``h`` and ``c``.

    Example:
        >>> step = LSTMStep(5, 3)
        >>> h, c = step([torch.zeros(2, 4), torch.zeros(2, 1)])
        >>> tuple(h.shape), tuple(step([torch.zeros(2, 5)], (h, c))[1].shape)
        ((2, 3), (2, 3))
    """

    def __init__(self, in_dim: int, hidden: int) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(in_dim, hidden)

    def forward(self, pieces: list[Tensor], state: State | None = None) -> State:
        """The next state.

        Arguments:
            pieces: input pieces, each ``[batch, size_k]``, the sizes summing to ``in_dim``.
            state: the previous ``(h, c)``, each ``[batch, hidden]``; zeros when ``None``.

        Returns:
            The new ``(h, c)``.
        """
        x = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=-1)
        h, c = self.cell(x, state)
        return h, c


class ConcatLinear(nn.Module):
    """A linear layer on the concatenation of its input pieces.

    Arguments:
        in_dim: the total size of the pieces.
        out_dim: the output size.

    Example:
        >>> tuple(ConcatLinear(5, 2)([torch.zeros(3, 2), torch.zeros(3, 3)]).shape)
        (3, 2)
    """

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_dim, out_dim)

    def forward(self, pieces: list[Tensor]) -> Tensor:
        """``W [x_1; x_2; ...] + b``.

        Arguments:
            pieces: each ``[batch, size_k]``.

        Returns:
            ``[batch, out_dim]``.
        """
        return self.linear(pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=-1))


class BiLSTM(nn.Module):
    """Stacked bidirectional LSTM layers, stepped one position at a time.

    Layer ``k + 1`` reads the two directions of layer ``k``. Every step is a call of a
    :func:`batchfold.function`-wrapped :class:`LSTMStep`, so inside ``batch_map`` it is one
    node, batched with the same step of every other sequence.

    Arguments:
        in_dim: the total size of a position's input pieces.
        hidden: the state size of each direction.
        layers: the number of layers.

    Raises:
        ValueError: ``layers`` is below 1.

    Example:
        >>> lstm = BiLSTM(4, 3, layers=2)
        >>> out = lstm([[torch.zeros(4)], [torch.ones(4)]])
        >>> len(out), [tuple(h.shape) for h in out[0]]
        (2, [(3,), (3,)])
    """

    def __init__(self, in_dim: int, hidden: int, layers: int = 1) -> None:
        super().__init__()
        if layers < 1:
            raise ValueError(f"expected at least 1 BiLSTM layer, found {layers}")
        self.hidden = hidden
        sizes = [in_dim] + [2 * hidden] * (layers - 1)
        self.forward_steps = nn.ModuleList(LSTMStep(size, hidden) for size in sizes)
        self.backward_steps = nn.ModuleList(LSTMStep(size, hidden) for size in sizes)
        # the wrappers keep one identity, so the steps of all sequences share a signature
        self._forward_calls = [bf.function(m, batched=True) for m in self.forward_steps]
        self._backward_calls = [bf.function(m, batched=True) for m in self.backward_steps]

    def forward(self, inputs: Sequence[list[Tensor]]) -> list[list[Tensor]]:
        """The last layer's states at every position.

        Arguments:
            inputs: for each position, its input pieces (each ``[size_k]``).

        Returns:
            For each position, ``[h_forward, h_backward]``, each ``[hidden]``.
        """
        layer = [list(pieces) for pieces in inputs]
        for step_forward, step_backward in zip(
            self._forward_calls, self._backward_calls, strict=True
        ):
            forward = _run(step_forward, layer)
            backward = _run(step_backward, layer[::-1])[::-1]
            layer = [[f, b] for f, b in zip(forward, backward, strict=True)]
        return layer


def _run(step: BatchedFunction, inputs: Sequence[list[Tensor]]) -> list[Tensor]:
    """The ``h`` of one direction at every position, in the order of ``inputs``."""
    state: State | None = None
    outputs: list[Tensor] = []
    for pieces in inputs:
        h, c = step(pieces, state) if state is not None else step(pieces)
        state = (h, c)
        outputs.append(h)
    return outputs


def unk_probabilities(counts: Sequence[int], alpha: float) -> list[float]:
    """Word dropout: the chance of replacing a word by ``<unk>`` in training, per word id.

    A word seen ``count`` times is replaced with probability ``alpha / (alpha + count)``
    (Kiperwasser and Goldberg 2016), so rare words are dropped most and the ``<unk>`` vector
    gets trained. Id 0 (``<unk>`` itself) gets 0.

    Arguments:
        counts: the training count of each word id.
        alpha: the dropout strength; 0 turns word dropout off.

    Returns:
        One probability per word id.

    Raises:
        ValueError: ``alpha`` is negative.

    Example:
        >>> unk_probabilities([0, 1, 3], 1.0)
        [0.0, 0.5, 0.25]
    """
    if alpha < 0:
        raise ValueError(f"expected a word dropout alpha of at least 0, found {alpha}")
    return [0.0 if i == 0 or alpha == 0 else alpha / (alpha + c) for i, c in enumerate(counts)]


def check_sizes(positive: dict[str, int], optional: tuple[str, int, str]) -> None:
    """Check a model's sizes: those of ``positive`` at least 1, the ``optional`` one at least 0.

    Arguments:
        positive: size name -> size.
        optional: ``(name, size, what 0 means)`` of a size that may be 0.

    Raises:
        ValueError: the first size out of range, by name.

    Example:
        >>> check_sizes({"hidden": 4}, ("char_dim", -1, "no characters"))
        Traceback (most recent call last):
        ...
        ValueError: expected char_dim of at least 0 (0: no characters), found -1
    """
    for name, size in positive.items():
        if size < 1:
            raise ValueError(f"expected {name} of at least 1, found {size}")
    name, size, zero_means = optional
    if size < 0:
        raise ValueError(f"expected {name} of at least 0 (0: {zero_means}), found {size}")


class WordDropoutModel(nn.Module):
    """The base of a model that reads :class:`~batchfold.data.conllu.Sentence` words by id.

    It keeps the index maps the model is built with (``vocabs``) and the word dropout chance
    of every word id (``unk_probability``); the subclass makes ``word_embedding``, whose
    device is the model's :attr:`device`. It registers no parameters, so the subclass's
    ``state_dict`` is its own.

    Arguments:
        vocabs: the index maps.
        word_counts: the training count of each word id (all 0 when ``None``).
        word_dropout: the word dropout strength ``alpha`` (see :func:`unk_probabilities`);
            words are replaced only in training mode.

    Raises:
        ValueError: ``word_counts`` does not have one count per word id, or ``word_dropout``
            is negative.
    """

    word_embedding: nn.Embedding

    def __init__(
        self, vocabs: UDVocabs, word_counts: Sequence[int] | None, word_dropout: float
    ) -> None:
        super().__init__()
        counts = list(word_counts) if word_counts is not None else [0] * len(vocabs.words)
        if len(counts) != len(vocabs.words):
            raise ValueError(
                f"expected one word count per word id ({len(vocabs.words)}), found {len(counts)}"
            )
        self.vocabs = vocabs
        self.unk_probability = unk_probabilities(counts, word_dropout)

    @property
    def device(self) -> torch.device:
        """Where the parameters live."""
        return self.word_embedding.weight.device

    def word_id(self, word: str) -> int:
        """A word's id, replaced by ``<unk>`` at random in training (word dropout).

        Arguments:
            word: a word form.

        Returns:
            Its id, or 0.
        """
        index = self.vocabs.words.lookup(word)
        if self.training and random.random() < self.unk_probability[index]:
            return 0
        return index


class TaggedWordsModel(WordDropoutModel):
    """The base of a parser: word and UPOS vectors of every token, with the root token last.

    Word ids come with word dropout (:meth:`WordDropoutModel.word_id`); a tag the model
    never saw, or (in training, with probability ``tag_dropout``) any tag, is read as the
    unknown tag. ``word_embedding`` has ``len(vocabs.words) + 1`` rows (the last is the root
    token's), ``pos_embedding`` ``len(vocabs.upos) + 2`` (the root token's row, then the
    unknown tag's), or is ``None`` without tags.

    Arguments:
        vocabs: the index maps.
        word_dim: the word vector size.
        pos_dim: the UPOS vector size; 0 leaves tags out.
        word_counts: the training count of each word id (all 0 when ``None``).
        word_dropout: the word dropout strength ``alpha``.
        tag_dropout: the chance that a training token's tag is read as unknown, in ``[0, 1)``.

    Raises:
        ValueError: ``tag_dropout`` is not in ``[0, 1)``, or as :class:`WordDropoutModel`.
    """

    def __init__(
        self,
        vocabs: UDVocabs,
        word_dim: int,
        pos_dim: int,
        word_counts: Sequence[int] | None,
        word_dropout: float,
        tag_dropout: float,
    ) -> None:
        if not 0.0 <= tag_dropout < 1.0:
            raise ValueError(f"expected tag_dropout in [0, 1), found {tag_dropout}")
        super().__init__(vocabs, word_counts, word_dropout)
        self.root_word = len(vocabs.words)  # an extra row for the root token
        self.root_tag = len(vocabs.upos)  # extra rows: the root token, then unseen tags
        self.tag_dropout = tag_dropout
        self.word_embedding = nn.Embedding(len(vocabs.words) + 1, word_dim)
        self.pos_embedding = nn.Embedding(len(vocabs.upos) + 2, pos_dim) if pos_dim else None

    def tag_id(self, tag: str) -> int:
        """A tag's row: the unknown tag's for an unseen tag, or at random in training.

        Arguments:
            tag: a UPOS tag.

        Returns:
            Its row in the tag embedding.
        """
        upos = self.vocabs.upos
        if tag not in upos or (
            self.training and self.tag_dropout and random.random() < self.tag_dropout
        ):
            return self.root_tag + 1
        return upos.index(tag)

    def token_ids(self, sentence: Sentence) -> list[tuple[int, int]]:
        """The word and UPOS rows of every token: words ``1..n``, then the root.

        Arguments:
            sentence: the sentence.

        Returns:
            ``n + 1`` pairs ``(word row, UPOS row)``.
        """
        tokens = [
            (self.word_id(w), self.tag_id(t))
            for w, t in zip(sentence.words, sentence.upos, strict=True)
        ]
        return [*tokens, (self.root_word, self.root_tag)]
