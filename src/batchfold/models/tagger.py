"""A BiLSTM part-of-speech tagger, written as single-sentence code for ``batch_map``.

A word is its word vector, optionally followed by the last states of a character-level
BiLSTM run over its letters (the tagger of Plank, Sogaard and Goldberg 2016, and of the DyNet
autobatching benchmarks). A BiLSTM runs over the sentence one word at a time, and a linear
layer with a softmax gives each word's UPOS tag.

:func:`sentence_losses` and :func:`predict_tags` are plain PyTorch for one sentence: run
eagerly they tag that sentence; inside :func:`batchfold.batch_map` the same code is recorded
for every sentence of a batch and run batched. Each LSTM step is one graph node, because the
cells are wrapped with :func:`batchfold.function`. :class:`LSTMStep` and :class:`BiLSTM` are
shared with the parser (:mod:`batchfold.models.parser`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import batchfold as bf
from batchfold.data.conllu import Sentence, UDVocabs
from batchfold.lazy import BatchedFunction

__all__ = [
    "BiLSTM",
    "BiLSTMTagger",
    "ConcatLinear",
    "LSTMStep",
    "State",
    "predict_tags",
    "sentence_losses",
    "unk_probabilities",
    "word_logits",
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


class BiLSTMTagger(nn.Module):
    """A BiLSTM tagger over word vectors and (optionally) character-level BiLSTM states.

    The model keeps the index maps it was built with, so that it reads :class:`Sentence`
    objects directly.

    Arguments:
        vocabs: the word, character and UPOS index maps.
        word_dim: the word vector size.
        char_dim: the character vector size and the character LSTM's state size per
            direction; 0 leaves the character BiLSTM out.
        hidden: the sentence BiLSTM's state size per direction.
        layers: the number of sentence BiLSTM layers.
        word_counts: the training count of each word id, for word dropout.
        word_dropout: the word dropout strength ``alpha`` (see :func:`unk_probabilities`);
            words are replaced only in training mode.

    Raises:
        ValueError: a size is not positive (``char_dim`` may be 0), or ``word_counts`` does
            not have one count per word id.

    Example:
        >>> from batchfold.data.conllu import build_vocabs
        >>> s = Sentence(("I", "ran"), ("PRON", "VERB"), (2, 0), ("nsubj", "root"))
        >>> tagger = BiLSTMTagger(build_vocabs([s]), word_dim=4, char_dim=3, hidden=5)
        >>> len(sentence_losses(tagger, s)), len(predict_tags(tagger, s))
        (2, 2)
    """

    def __init__(
        self,
        vocabs: UDVocabs,
        word_dim: int = 100,
        char_dim: int = 50,
        hidden: int = 125,
        layers: int = 1,
        word_counts: Sequence[int] | None = None,
        word_dropout: float = 0.0,
    ) -> None:
        super().__init__()
        for name, size in (("word_dim", word_dim), ("hidden", hidden), ("layers", layers)):
            if size < 1:
                raise ValueError(f"expected {name} of at least 1, found {size}")
        if char_dim < 0:
            raise ValueError(
                f"expected char_dim of at least 0 (0: no characters), found {char_dim}"
            )
        counts = list(word_counts) if word_counts is not None else [0] * len(vocabs.words)
        if len(counts) != len(vocabs.words):
            raise ValueError(
                f"expected one word count per word id ({len(vocabs.words)}), found {len(counts)}"
            )
        self.vocabs = vocabs
        self.unk_probability = unk_probabilities(counts, word_dropout)
        self.word_embedding = nn.Embedding(len(vocabs.words), word_dim)
        self.char_embedding = nn.Embedding(len(vocabs.chars), char_dim) if char_dim else None
        self.char_lstm = BiLSTM(char_dim, char_dim) if char_dim else None
        self.bilstm = BiLSTM(word_dim + 2 * char_dim, hidden, layers)
        self.output = ConcatLinear(2 * hidden, len(vocabs.upos))
        self._output_call = bf.function(self.output, batched=True)

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

    def word_input(self, word: str, device: torch.device) -> list[Tensor]:
        """The input pieces of one word: its vector and the character BiLSTM's last states.

        Arguments:
            word: a word form.
            device: where the model is (:attr:`device`).

        Returns:
            ``[vector]`` or ``[vector, h_forward, h_backward]``.
        """
        pieces = [self.word_embedding(torch.tensor(self.word_id(word), device=device))]
        if self.char_embedding is not None and self.char_lstm is not None:
            ids = self.vocabs.chars.encode(word) or [0]
            chars = self.char_embedding(torch.tensor(ids, device=device)).unbind(0)
            states = self.char_lstm([[c] for c in chars])
            pieces += [states[-1][0], states[0][1]]
        return pieces

    def logits(self, states: list[Tensor]) -> Tensor:
        """Tag scores of one word from its BiLSTM states.

        Arguments:
            states: ``[h_forward, h_backward]``.

        Returns:
            ``[n_tags]``.
        """
        return self._output_call(states)


def word_logits(model: BiLSTMTagger, sentence: Sentence) -> list[Tensor]:
    """The tag scores of every word of one sentence (single-sentence code).

    Arguments:
        model: the tagger.
        sentence: the sentence.

    Returns:
        One ``[n_tags]`` tensor per word.
    """
    device = model.device  # read once: inside batch_map each read is a recorded call
    states = model.bilstm([model.word_input(w, device) for w in sentence.words])
    return [model.logits(s) for s in states]


def sentence_losses(model: BiLSTMTagger, sentence: Sentence) -> list[Tensor]:
    """The cross-entropy of each word's gold UPOS tag (single-sentence code for ``batch_map``).

    Arguments:
        model: the tagger.
        sentence: a sentence whose tags are all known to ``model.vocabs.upos``.

    Returns:
        One scalar loss per word.

    Raises:
        KeyError: a tag is not in the tag set.

    Example:
        >>> from batchfold.data.conllu import build_vocabs
        >>> s = Sentence(("a", "b"), ("X", "Y"), (2, 0), ("dep", "root"))
        >>> model = BiLSTMTagger(build_vocabs([s]), word_dim=3, char_dim=0, hidden=2)
        >>> batched = bf.batch_map(lambda x: sentence_losses(model, x), [s, s])
        >>> torch.allclose(torch.stack(batched[1]), torch.stack(sentence_losses(model, s)))
        True
    """
    device = model.device
    tags = model.vocabs.upos.encode(sentence.upos)
    return [
        F.cross_entropy(scores, torch.tensor(tag, device=device))
        for scores, tag in zip(word_logits(model, sentence), tags, strict=True)
    ]


def predict_tags(model: BiLSTMTagger, sentence: Sentence) -> list[int]:
    """The best tag id of every word (single-sentence code; one read of the scores).

    The scores are read with ``.tolist()``, a sync point inside ``batch_map``; ties go to the
    lower tag id, as with ``argmax``.

    Arguments:
        model: the tagger.
        sentence: the sentence (its gold tags are not used).

    Returns:
        One tag id per word; ``model.vocabs.upos.decode`` gives the tags.
    """
    rows: list[list[float]] = torch.stack(word_logits(model, sentence)).tolist()
    return [max(range(len(row)), key=row.__getitem__) for row in rows]
