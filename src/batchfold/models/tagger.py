"""A BiLSTM part-of-speech tagger, written as single-sentence code for ``batch_map``.

A word is its word vector, optionally followed by the last states of a character-level
BiLSTM run over its letters (the tagger of Plank, Sogaard and Goldberg 2016, and of the DyNet
autobatching benchmarks). A BiLSTM runs over the sentence one word at a time, and a linear
layer with a softmax gives each word's UPOS tag.

:func:`sentence_losses` and :func:`predict_tags` are plain PyTorch for one sentence: run
eagerly they tag that sentence; inside :func:`batchfold.batch_map` the same code is recorded
for every sentence of a batch and run batched. Each LSTM step is one graph node, because the
cells are wrapped with :func:`batchfold.function`. The BiLSTM, the LSTM step and word
dropout come from :mod:`batchfold.models.bilstm`, shared with the parser
(:mod:`batchfold.models.parser`); they are importable from here as well.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import batchfold as bf
from batchfold.data.conllu import Sentence
from batchfold.data.ud import UDVocabs
from batchfold.models.bilstm import (
    BiLSTM,
    ConcatLinear,
    LSTMStep,
    State,
    WordDropoutModel,
    check_sizes,
    unk_probabilities,
)

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


class BiLSTMTagger(WordDropoutModel):
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
        >>> from batchfold.data.ud import build_vocabs
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
        check_sizes(
            {"word_dim": word_dim, "hidden": hidden, "layers": layers},
            ("char_dim", char_dim, "no characters"),
        )
        super().__init__(vocabs, word_counts, word_dropout)
        self.word_embedding = nn.Embedding(len(vocabs.words), word_dim)
        self.char_embedding = nn.Embedding(len(vocabs.chars), char_dim) if char_dim else None
        self.char_lstm = BiLSTM(char_dim, char_dim) if char_dim else None
        self.bilstm = BiLSTM(word_dim + 2 * char_dim, hidden, layers)
        self.output = ConcatLinear(2 * hidden, len(vocabs.upos))
        self._output_call = bf.function(self.output, batched=True)

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
            ids = self.char_ids(word)
            chars = self.char_embedding(torch.tensor(ids, device=device)).unbind(0)
            states = self.char_lstm([[c] for c in chars])
            pieces += [states[-1][0], states[0][1]]
        return pieces

    def char_ids(self, word: str) -> list[int]:
        """The character vector rows of a word (one unknown character for an empty word)."""
        return self.vocabs.chars.encode(word) or [0]

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
        >>> from batchfold.data.ud import build_vocabs
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
        One tag id per word (none for a sentence of no words); ``model.vocabs.upos.decode``
        gives the tags.
    """
    if not len(sentence):
        return []
    rows: list[list[float]] = torch.stack(word_logits(model, sentence)).tolist()
    return [max(range(len(row)), key=row.__getitem__) for row in rows]
