"""The ``biaffine`` job: a biaffine graph-based parser on UD English-EWT
(``batchfold train biaffine``).

Dozat and Manning's (2017) parser (:mod:`batchfold.models.biaffine`): every word picks its
head by a softmax over the sentence, so training reads no transitions and keeps every
sentence, non-projective ones included. Each batch runs :func:`~batchfold.models.biaffine.sentence_loss`
with :func:`batchfold.batch_map`; evaluation runs :func:`~batchfold.models.biaffine.parse` (each
word's best head, then its best relation) the same way, with no sync point.

Metrics, tags and options are the ``parser`` job's (:mod:`batchfold.training.parser`): UAS and
LAS in percent over every word, punctuation included; gold UPOS tags in training and, with
``--predicted-tags PATH``, a tagger's tags on dev and test; GloVe word vectors with ``--glove``.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from functools import partial

import torch
from torch import Tensor, nn

from batchfold.data.conllu import Sentence
from batchfold.models.biaffine import BiaffineParser, decode, parse, sentence_loss
from batchfold.schedule import Scheduler
from batchfold.training.parser import add_common_arguments, apply_predicted_tags, parse_metrics
from batchfold.training.ud import (
    UDSplits,
    UDTask,
    add_option,
    expect_model,
    glove_vectors,
    load_splits,
)

__all__ = ["BiaffineTask", "add_arguments", "make_task"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The biaffine parser's command line options (plus the UD data options).

    Arguments:
        parser: the parser of ``batchfold train biaffine``.
    """
    add_common_arguments(parser, pos_dim=50, hidden=125)
    add_option(parser, "--arc-dim", type=int, default=200, help="arc scoring vector size")
    add_option(parser, "--label-dim", type=int, default=100, help="relation scoring vector size")
    add_option(
        parser,
        "--dropout",
        type=float,
        default=0.33,
        help="dropout on the inputs, between BiLSTM layers and on the scoring vectors",
    )
    parser.set_defaults(optimizer="adam", lr=0.002, batch_size=32, epochs=15, lr_schedule="cosine")


class BiaffineTask(UDTask[BiaffineParser]):
    """A biaffine BiLSTM parser on UD English-EWT, for the generic training loop.

    Arguments:
        splits: the train, dev and test sentences.
        sizes: the model's sizes and dropout: ``word_dim``, ``pos_dim``, ``hidden``,
            ``layers``, ``arc_dim``, ``label_dim``, ``dropout``.
        word_dropout: the word dropout ``alpha``.
        tag_dropout: the chance that a training token's tag is read as unknown.
        glove: start the word vectors from GloVe (as the ``parser`` job's ``glove``).
        seed: the seed of the random vectors of words GloVe lacks.
        eval_batch: sentences per ``batch_map`` call when evaluating.
        scheduler: ``batch_map``'s scheduler.
        tagger_upos: when dev and test carry predicted tags, the tagger's accuracy on them.
    """

    name = "biaffine"
    best_metric = "dev_uas"
    model_class = BiaffineParser

    def __init__(
        self,
        splits: UDSplits,
        sizes: Mapping[str, float],
        *,
        word_dropout: float = 0.25,
        tag_dropout: float = 0.0,
        glove: str | None = None,
        seed: int = 0,
        eval_batch: int = 512,
        scheduler: Scheduler = "agenda",
        tagger_upos: Mapping[str, float] | None = None,
    ) -> None:
        super().__init__(splits, splits.train, eval_batch, scheduler)
        self.sizes = dict(sizes)
        self.word_dropout = word_dropout
        self.tag_dropout = tag_dropout
        word_dim = int(self.sizes["word_dim"])
        self.vectors, self.glove_words = glove_vectors(self.vocabs, glove, word_dim, seed)
        self.tagger_upos = dict(tagger_upos) if tagger_upos is not None else None

    def train_items(self) -> Sequence[Sentence]:
        """Every training sentence (non-projective ones too)."""
        return self.splits.train

    def build_model(self) -> nn.Module:
        """A freshly initialised :class:`~batchfold.models.biaffine.BiaffineParser`."""
        sizes = {k: v if k == "dropout" else int(v) for k, v in self.sizes.items()}
        model = BiaffineParser(
            self.vocabs,
            **sizes,  # type: ignore[arg-type]
            word_counts=self.word_counts,
            word_dropout=self.word_dropout,
            tag_dropout=self.tag_dropout,
        )
        if self.vectors is not None:
            with torch.no_grad():  # the root token's extra row keeps its random start
                model.word_embedding.weight[: len(self.vectors)].copy_(self.vectors)
        return model

    def summed_loss(
        self, model: BiaffineParser, batch: Sequence[Sentence], batched: bool
    ) -> tuple[Tensor, int]:
        """The summed head and relation cross-entropy of a batch, and its number of terms."""
        losses = self.each(partial(sentence_loss, model), batch, batched)
        return torch.stack(losses).sum(), sum(2 * len(s) for s in batch)

    def evaluate(self, model: nn.Module, split: str) -> dict[str, float]:
        """UAS and LAS in percent over every word (punctuation included).

        Arguments:
            model: the parser.
            split: ``"dev"`` or ``"test"``.

        Returns:
            ``{f"{split}_uas": uas, f"{split}_las": las}``, and ``f"{split}_tagger_upos"``
            when the split's tags were predicted.
        """
        parser: BiaffineParser = expect_model(model, BiaffineParser)
        sentences, parsed = self.predict(parser, parse, split)
        decoded = [decode(parser, heads, labels) for heads, labels in parsed]
        return parse_metrics(split, sentences, decoded, self.tagger_upos)


def make_task(args: argparse.Namespace) -> BiaffineTask:
    """The biaffine parser job configured by the options of :func:`add_arguments`.

    Arguments:
        args: the parsed command line.

    Returns:
        The task.

    Raises:
        ConfigError: as the ``parser`` job's ``--predicted-tags``.
    """
    sizes = {
        "word_dim": args.word_dim,
        "pos_dim": args.pos_dim,
        "hidden": args.hidden,
        "layers": args.layers,
        "arc_dim": args.arc_dim,
        "label_dim": args.label_dim,
        "dropout": args.dropout,
    }
    task = BiaffineTask(
        load_splits(args),
        sizes,
        word_dropout=args.word_dropout,
        tag_dropout=args.tag_dropout,
        glove=args.glove,
        seed=args.seed,
        eval_batch=args.eval_batch_size,
        scheduler=getattr(args, "scheduler", "agenda"),
    )
    if task.glove_words is not None:
        args.glove_words = task.glove_words  # recorded in config.json
    described = apply_predicted_tags(task, args)
    print(
        f"biaffine: {described}; {len(task.vocabs.words)} words, {len(task.vocabs.deprels)} relations"
    )
    return task
