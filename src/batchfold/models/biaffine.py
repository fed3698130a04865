"""A graph-based dependency parser with biaffine scoring (Dozat and Manning 2017).

Each token is its word vector and (optionally) its UPOS tag's vector, with the root token
appended at the end as in :class:`~batchfold.models.parser.ArcHybridParser` (words ``1..n``
at rows ``0..n-1``, the root at row ``n``). Stacked bidirectional ``nn.LSTM`` layers read the
whole sentence; two ReLU layers give each token a vector as a dependent and one as a head,
and the score of head ``j`` for word ``i`` is ``dep_i U head_j + head_j u``: one
``[n + 1, n + 1]`` matrix per sentence. Each word's head is a softmax over the columns. The
relation of word ``i`` attached to head ``h`` is scored from two other ReLU vectors by a
bilinear layer plus a linear one over both, as Dozat and Manning's relation classifier.

Everything is single-sentence PyTorch code on whole-sentence tensors, for
:func:`batchfold.batch_map`:

* :func:`sentence_loss`: the cross-entropy of every word's gold head plus that of its gold
  relation (scored at the gold head).
* :func:`parse`: each word's best-scoring head (``argmax`` per word, as Dozat and Manning's
  parser before its tree repair; the heads need not form a tree) and the best relation for
  that head; nothing is read inside, so a batch runs with no sync point.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from batchfold.data.conllu import Sentence
from batchfold.data.ud import UDVocabs
from batchfold.models.bilstm import TaggedWordsModel, check_sizes

__all__ = ["BiaffineParser", "decode", "gold_columns", "parse", "sentence_loss"]

IGNORE = -100
"""The target of the root token's own row (``cross_entropy``'s default ``ignore_index``)."""


class BiaffineParser(TaggedWordsModel):
    """Dozat and Manning's (2017) biaffine parser over BiLSTM states of a whole sentence.

    Arguments:
        vocabs: the word, UPOS and relation index maps.
        word_dim: the word vector size.
        pos_dim: the UPOS vector size; 0 leaves tags out.
        hidden: the BiLSTM state size per direction.
        layers: the number of BiLSTM layers.
        arc_dim: the size of the dependent and head vectors that score arcs.
        label_dim: the size of the dependent and head vectors that score relations.
        dropout: the dropout on the token inputs, between BiLSTM layers and after the last.
        word_counts: the training count of each word id, for word dropout.
        word_dropout: the word dropout strength (see
            :func:`~batchfold.models.bilstm.unk_probabilities`), applied in training mode.
        tag_dropout: in training mode, the chance that a token's tag is read as the unknown
            tag.

    Raises:
        ValueError: a size is not positive (``pos_dim`` may be 0), ``dropout`` or
            ``tag_dropout`` is not in ``[0, 1)``, or ``word_counts`` does not have one count
            per word id.

    Example:
        >>> from batchfold.data.ud import build_vocabs
        >>> s = Sentence(("I", "ran"), ("PRON", "VERB"), (2, 0), ("nsubj", "root"))
        >>> model = BiaffineParser(build_vocabs([s]), word_dim=4, pos_dim=2, hidden=3,
        ...                        arc_dim=5, label_dim=2)
        >>> tuple(model.arc_scores(model.encode(s)).shape), sentence_loss(model, s).shape
        ((3, 3), torch.Size([]))
    """

    def __init__(
        self,
        vocabs: UDVocabs,
        word_dim: int = 100,
        pos_dim: int = 50,
        hidden: int = 200,
        layers: int = 2,
        arc_dim: int = 300,
        label_dim: int = 100,
        dropout: float = 0.33,
        word_counts: Sequence[int] | None = None,
        word_dropout: float = 0.0,
        tag_dropout: float = 0.0,
    ) -> None:
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"expected dropout in [0, 1), found {dropout}")
        check_sizes(
            {
                "word_dim": word_dim,
                "hidden": hidden,
                "layers": layers,
                "arc_dim": arc_dim,
                "label_dim": label_dim,
            },
            ("pos_dim", pos_dim, "no tags"),
        )
        super().__init__(vocabs, word_dim, pos_dim, word_counts, word_dropout, tag_dropout)
        n_labels = len(vocabs.deprels)
        sizes = [word_dim + pos_dim] + [2 * hidden] * (layers - 1)
        self.lstms = nn.ModuleList(nn.LSTM(size, hidden, bidirectional=True) for size in sizes)
        self.dropout = nn.Dropout(dropout)
        self.arc_dep = nn.Linear(2 * hidden, arc_dim)
        self.arc_head = nn.Linear(2 * hidden, arc_dim)
        # U starts at 0, as in Dozat and Manning: every head starts equally likely
        self.arc_weight = nn.Parameter(torch.zeros(arc_dim, arc_dim))
        self.arc_head_bias = nn.Linear(arc_dim, 1, bias=False)
        self.label_dep = nn.Linear(2 * hidden, label_dim)
        self.label_head = nn.Linear(2 * hidden, label_dim)
        # the bilinear term as one matrix: column block k is relation k's [label_dim]^2 form
        self.label_weight = nn.Parameter(torch.empty(label_dim, n_labels * label_dim))
        nn.init.uniform_(self.label_weight, -(label_dim**-0.5), label_dim**-0.5)
        self.label_linear = nn.Linear(2 * label_dim, n_labels)

    def encode(self, sentence: Sentence) -> Tensor:
        """The top BiLSTM layer's states of every token: words ``1..n``, then the root.

        Arguments:
            sentence: the sentence.

        Returns:
            ``[n + 1, 2 * hidden]``.
        """
        device = self.device  # read once: inside batch_map each read is a recorded call
        ids = self.token_ids(sentence)
        x = self.word_embedding(torch.tensor([w for w, _ in ids], device=device))
        if self.pos_embedding is not None:
            tags = self.pos_embedding(torch.tensor([t for _, t in ids], device=device))
            x = torch.cat([x, tags], dim=-1)
        x = self.dropout(x)
        for lstm in self.lstms:
            x, _ = lstm(x)
            x = self.dropout(x)
        return x

    def arc_scores(self, states: Tensor) -> Tensor:
        """The score of every head (columns) for every token (rows).

        Arguments:
            states: :meth:`encode`'s ``[n + 1, 2 * hidden]``.

        Returns:
            ``[n + 1, n + 1]``; row ``n`` (the root token's own head) is never used.
        """
        dep = self.dropout(torch.relu(self.arc_dep(states)))
        head = self.dropout(torch.relu(self.arc_head(states)))
        return (dep @ self.arc_weight) @ head.T + self.arc_head_bias(head).squeeze(-1)

    def label_scores(self, states: Tensor, heads: Tensor) -> Tensor:
        """The relation scores of every token attached to the given heads.

        Arguments:
            states: :meth:`encode`'s ``[n + 1, 2 * hidden]``.
            heads: each token's head as a row of ``states`` (``[n + 1]``, int64; the root
                token's own row is scored too, and never used).

        Returns:
            ``[n + 1, n_labels]``.
        """
        dep = self.dropout(torch.relu(self.label_dep(states)))
        head = self.dropout(torch.relu(self.label_head(states)))[heads]
        forms = (dep @ self.label_weight).unflatten(-1, (-1, head.shape[-1]))  # [n, labels, d]
        bilinear = (forms * head.unsqueeze(-2)).sum(-1)
        return bilinear + self.label_linear(torch.cat([dep, head], dim=-1))


def gold_columns(sentence: Sentence) -> list[int]:
    """Each word's gold head as a row of :meth:`BiaffineParser.encode`: head ``h`` is row
    ``h - 1``, and the root (0) row ``n``.

    Example:
        >>> gold_columns(Sentence(("a", "b"), ("X", "Y"), (2, 0), ("dep", "root")))
        [1, 2]
    """
    n = len(sentence)
    return [n if h == 0 else h - 1 for h in sentence.heads]


def sentence_loss(model: BiaffineParser, sentence: Sentence) -> Tensor:
    """The summed cross-entropy of every word's gold head and gold relation (single-sentence
    code for ``batch_map``).

    Arguments:
        model: the parser.
        sentence: a sentence whose relations the model knows (any tree, projective or not).

    Returns:
        A scalar: ``2 * len(sentence)`` terms.

    Raises:
        KeyError: a relation is not in the model's relation set.
    """
    device = model.device
    states = model.encode(sentence)
    # the root's row takes part with an ignored target: no [:-1] of a sentence-long tensor
    heads = gold_columns(sentence)
    labels = [model.vocabs.deprels.index(r) for r in sentence.deprels]
    arc_target = torch.tensor([*heads, IGNORE], device=device)
    label_target = torch.tensor([*labels, IGNORE], device=device)
    rows = torch.tensor([*heads, len(heads)], device=device)
    arc_loss = F.cross_entropy(model.arc_scores(states), arc_target, reduction="sum")
    label_loss = F.cross_entropy(model.label_scores(states, rows), label_target, reduction="sum")
    return arc_loss + label_loss


def parse(model: BiaffineParser, sentence: Sentence) -> tuple[Tensor, Tensor]:
    """Each word's best head and the best relation for it (single-sentence code; no reads).

    Arguments:
        model: the parser.
        sentence: the sentence (its words and, when the model uses them, its tags).

    Returns:
        ``(heads, relation ids)``, each ``[n + 1]`` (int64; the last, the root token's own,
        is never used): heads as rows of :meth:`BiaffineParser.encode` (row ``n`` is the
        root); :func:`decode` turns them into CoNLL-U heads and relation names.
    """
    states = model.encode(sentence)
    heads = model.arc_scores(states).argmax(-1)
    return heads, model.label_scores(states, heads).argmax(-1)


def decode(model: BiaffineParser, heads: Tensor, labels: Tensor) -> tuple[list[int], list[str]]:
    """:func:`parse`'s output as CoNLL-U heads (0 for the root) and relation names.

    Example:
        >>> from batchfold.data.ud import build_vocabs
        >>> s = Sentence(("a", "b"), ("X", "Y"), (2, 0), ("dep", "root"))
        >>> model = BiaffineParser(build_vocabs([s]), word_dim=2, pos_dim=0, hidden=2,
        ...                        arc_dim=2, label_dim=2)
        >>> decode(model, torch.tensor([1, 2, 0]), torch.tensor([0, 0, 1]))
        ([2, 0], ['dep', 'dep'])
    """
    n = len(heads) - 1
    names = model.vocabs.deprels.labels
    rows, relations = heads.tolist()[:n], labels.tolist()[:n]
    return [0 if h == n else h + 1 for h in rows], [names[i] for i in relations]
