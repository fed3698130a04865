"""An arc-hybrid dependency parser with BiLSTM features (Kiperwasser and Goldberg 2016).

Each word is its word vector and (optionally) its UPOS tag's vector; a two-layer BiLSTM
runs over the sentence with the root token appended at the end, where
:class:`~batchfold.models.transitions.ArcHybrid` keeps it. A configuration is scored from the
BiLSTM vectors of the three top stack items and the first buffer item (a learned pad vector
stands in for a missing stack item) by an MLP whose outputs are split in two: one score per
transition (SHIFT, LEFT_ARC, RIGHT_ARC), then one per relation for each arc direction
(see :func:`score_layout`). The transition and the relation of an arc each get a softmax.

Everything is single-sentence PyTorch code for :func:`batchfold.batch_map`:

* :func:`sentence_loss`: static-oracle training, the cross-entropy of each gold transition
  plus that of its relation; the transitions are known in advance, so nothing is read.
* :func:`parse`: greedy decoding. Each step reads its scores (``.tolist()``), a sync point:
  inside ``batch_map`` every sentence waits there, one batched run scores them all, and each
  continues with its best legal transition.
* :func:`exploring_loss`: dynamic-oracle training with exploration (Goldberg and Nivre
  2013), which reads the scores at every step to decide where to go next.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch
from torch import Tensor, nn

import batchfold as bf
from batchfold.data.conllu import Sentence
from batchfold.data.ud import UDVocabs
from batchfold.models.bilstm import BiLSTM, TaggedWordsModel, check_sizes
from batchfold.models.parser_scores import (
    N_FEATURES,
    best_transition,
    feature_positions,
    score_layout,
    transition_loss,
)
from batchfold.models.transitions import Action, ArcHybrid, action_cost, oracle_transitions

__all__ = [
    "ArcHybridParser",
    "FeatureMLP",
    "best_transition",
    "cheapest_actions",
    "exploring_loss",
    "feature_positions",
    "parse",
    "score_layout",
    "sentence_loss",
    "transition_loss",
]


class FeatureMLP(nn.Module):
    """``W2 tanh(W1 [v_1; ...; v_k] + b1) + b2`` over the feature vectors of a configuration.

    Arguments:
        in_dim: the total size of the feature vectors.
        hidden: the hidden layer size.
        out_dim: the number of scores.

    Example:
        >>> mlp = FeatureMLP(6, 4, 3)
        >>> tuple(mlp([torch.zeros(2, 3), torch.zeros(2, 3)]).shape)
        (2, 3)
    """

    def __init__(self, in_dim: int, hidden: int, out_dim: int) -> None:
        super().__init__()
        self.hidden = nn.Linear(in_dim, hidden)
        self.output = nn.Linear(hidden, out_dim)

    def forward(self, features: list[Tensor]) -> Tensor:
        """Scores from the feature vectors.

        Arguments:
            features: each ``[batch, size_k]``.

        Returns:
            ``[batch, out_dim]``.
        """
        return self.output(torch.tanh(self.hidden(torch.cat(features, dim=-1))))


class ArcHybridParser(TaggedWordsModel):
    """The Kiperwasser and Goldberg (2016) arc-hybrid parser with BiLSTM features.

    The model keeps the index maps it was built with, so that it reads :class:`Sentence`
    objects directly. UPOS tags, when used (``pos_dim > 0``), are read from the sentence: gold
    tags unless the caller puts predicted ones there.

    Arguments:
        vocabs: the word, UPOS and relation index maps.
        word_dim: the word vector size.
        pos_dim: the UPOS vector size; 0 leaves tags out.
        hidden: the BiLSTM state size per direction.
        layers: the number of BiLSTM layers.
        mlp_hidden: the MLP's hidden layer size.
        word_counts: the training count of each word id, for word dropout.
        word_dropout: the word dropout strength (see
            :func:`~batchfold.models.bilstm.unk_probabilities`), applied in training mode.
        tag_dropout: in training mode, the chance that a token's tag is read as the unknown
            tag, so that the parser learns not to trust tags blindly (predicted tags are
            wrong at times).

    Raises:
        ValueError: a size is not positive (``pos_dim`` may be 0), ``word_counts`` does
            not have one count per word id, or ``tag_dropout`` is not in ``[0, 1)``.

    Example:
        >>> from batchfold.data.ud import build_vocabs
        >>> s = Sentence(("I", "ran"), ("PRON", "VERB"), (2, 0), ("nsubj", "root"))
        >>> model = ArcHybridParser(build_vocabs([s]), word_dim=4, pos_dim=2, hidden=3,
        ...                         mlp_hidden=5)
        >>> model.n_scores, len(parse(model, s)[0]), sentence_loss(model, s).shape
        (7, 2, torch.Size([]))
    """

    def __init__(
        self,
        vocabs: UDVocabs,
        word_dim: int = 100,
        pos_dim: int = 25,
        hidden: int = 125,
        layers: int = 2,
        mlp_hidden: int = 100,
        word_counts: Sequence[int] | None = None,
        word_dropout: float = 0.0,
        tag_dropout: float = 0.0,
    ) -> None:
        check_sizes(
            {"word_dim": word_dim, "hidden": hidden, "layers": layers, "mlp_hidden": mlp_hidden},
            ("pos_dim", pos_dim, "no tags"),
        )
        super().__init__(vocabs, word_dim, pos_dim, word_counts, word_dropout, tag_dropout)
        self.n_labels = len(vocabs.deprels)
        self.n_scores = len(Action) + 2 * self.n_labels
        self.bilstm = BiLSTM(word_dim + pos_dim, hidden, layers)
        self.pad = nn.Embedding(1, 2 * hidden)  # the vector of a missing stack item
        self.scorer = FeatureMLP(N_FEATURES * 2 * hidden, mlp_hidden, self.n_scores)
        self._score_call = bf.function(self.scorer, batched=True)

    def _token_input(self, word_id: int, tag_id: int, device: torch.device) -> list[Tensor]:
        pieces = [self.word_embedding(torch.tensor(word_id, device=device))]
        if self.pos_embedding is not None:
            pieces.append(self.pos_embedding(torch.tensor(tag_id, device=device)))
        return pieces

    def encode(self, sentence: Sentence) -> list[Tensor]:
        """The BiLSTM vector of every token: words ``1..n`` at ``0..n-1``, the root at ``n``.

        Arguments:
            sentence: the sentence.

        Returns:
            ``n + 1`` tensors, each ``[2 * hidden]``.
        """
        device = self.device  # read once: inside batch_map each read is a recorded call
        inputs = [self._token_input(w, t, device) for w, t in self.token_ids(sentence)]
        return [torch.cat(states) for states in self.bilstm(inputs)]

    def pad_vector(self) -> Tensor:
        """The learned vector of a missing stack item, as a per-sentence value.

        Looking it up by a per-sentence index makes it a value of the sentence inside
        ``batch_map``, so that every configuration's features are per-sentence values and
        all scoring calls share one signature.

        Returns:
            ``[2 * hidden]``.
        """
        return self.pad(torch.tensor(0, device=self.device))

    def score(self, config: ArcHybrid, vectors: Sequence[Tensor], pad: Tensor) -> Tensor:
        """The transition and relation scores of a configuration.

        Arguments:
            config: the configuration.
            vectors: the token vectors from :meth:`encode`.
            pad: the vector from :meth:`pad_vector`.

        Returns:
            ``[n_scores]``, laid out as in :func:`score_layout`.
        """
        positions = feature_positions(config)
        return self._score_call([pad if p is None else vectors[p] for p in positions])


_transition_loss = bf.function(transition_loss, batched=True)


def _loss_of(scores: Tensor, action: Action, label: int | None, device: torch.device) -> Tensor:
    target = torch.tensor([int(action), -100 if label is None else label], device=device)
    return _transition_loss(scores, target)


def sentence_loss(model: ArcHybridParser, sentence: Sentence) -> Tensor:
    """Static-oracle training loss of one projective sentence (single-sentence code).

    The summed :func:`transition_loss` of the gold transitions of :func:`oracle_transitions`.

    Arguments:
        model: the parser.
        sentence: a sentence with a projective tree and relations known to the model.

    Returns:
        A scalar; the sentence has ``2 * len(sentence)`` transitions (0 for a sentence of no
        words, whose loss is 0).

    Raises:
        ValueError: the tree is not projective.
        KeyError: a relation is not in the model's relation set.
    """
    device = model.device
    vectors, pad = model.encode(sentence), model.pad_vector()
    config = ArcHybrid(len(sentence))
    losses = []
    for action, label in oracle_transitions(sentence):
        label_id = None if label is None else model.vocabs.deprels.index(label)
        losses.append(_loss_of(model.score(config, vectors, pad), action, label_id, device))
        config.apply(action, label)
    return torch.stack(losses).sum() if losses else torch.zeros((), device=device)


def parse(model: ArcHybridParser, sentence: Sentence) -> tuple[list[int], list[str]]:
    """Greedy parsing of one sentence (single-sentence code; one read per transition).

    Arguments:
        model: the parser.
        sentence: the sentence (its words and, when the model uses them, its tags).

    Returns:
        ``(heads, relations)``, one per word; a head of 0 is the root.
    """
    vectors, pad = model.encode(sentence), model.pad_vector()
    config = ArcHybrid(len(sentence))
    labels = model.vocabs.deprels
    while not config.is_terminal():
        scores: list[float] = model.score(config, vectors, pad).tolist()  # a sync point
        action, label = best_transition(scores, config, model.n_labels)
        config.apply(action, None if label is None else labels.labels[label])
    return list(config.heads), [label or "" for label in config.labels]


def exploring_loss(
    model: ArcHybridParser, sentence: Sentence, explore: float, rng: random.Random | None = None
) -> tuple[Tensor, int]:
    """Dynamic-oracle training loss with exploration, for one sentence (single-sentence code).

    At each step the scores are read (a sync point). The target is the best-scoring legal
    transition of least cost (:func:`~batchfold.models.transitions.action_cost`: 0 for a projective
    tree), with the gold relation when it attaches the stack top to its gold head; the loss
    is its :func:`transition_loss`. The parser then follows its own best transition with
    probability ``explore`` when that one costs more, and the target otherwise, so that it
    learns to act well after its own mistakes.

    Arguments:
        model: the parser.
        sentence: a sentence whose relations the model knows.
        explore: the probability of following a wrong prediction.
        rng: the random source (the ``random`` module when ``None``).

    Returns:
        ``(summed loss, number of transitions)``; ``(0, 0)`` for a sentence of no words.
    """
    draw = rng.random if rng is not None else random.random
    device = model.device
    vectors, pad = model.encode(sentence), model.pad_vector()
    config = ArcHybrid(len(sentence))
    heads = sentence.heads
    losses = []
    while not config.is_terminal():
        scores_lazy = model.score(config, vectors, pad)
        scores: list[float] = scores_lazy.tolist()  # a sync point
        correct = cheapest_actions(config, heads)
        target = max(correct, key=lambda a: scores[a])
        label = None
        if target is not Action.SHIFT:
            dependent = config.stack[-1]
            head = config.b0 if target is Action.LEFT_ARC else config.stack[-2]
            if heads[dependent - 1] == head:
                label = model.vocabs.deprels.index(sentence.deprels[dependent - 1])
        losses.append(_loss_of(scores_lazy, target, label, device))
        predicted, _ = best_transition(scores, config, model.n_labels)
        config.apply(predicted if predicted not in correct and draw() < explore else target)
    return torch.stack(losses).sum() if losses else torch.zeros((), device=device), len(losses)


def cheapest_actions(config: ArcHybrid, gold_heads: Sequence[int]) -> list[Action]:
    """The legal transitions that lose the fewest gold arcs (none, for a projective tree).

    Arguments:
        config: a configuration that is not terminal.
        gold_heads: the gold head of every word.

    Returns:
        The transitions, in :class:`Action` order.

    Example:
        >>> c = ArcHybrid(2); c.apply(Action.SHIFT)  # stack [1], buffer [2, 0]
        >>> cheapest_actions(c, [2, 0]), cheapest_actions(c, [0, 1])
        ([<Action.LEFT_ARC: 1>], [<Action.SHIFT: 0>])
    """
    costs = {a: action_cost(config, a, gold_heads) for a in config.legal_actions()}
    least = min(costs.values())
    return [a for a, cost in costs.items() if cost == least]
