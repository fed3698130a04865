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
from typing import Any

import torch
from torch import Tensor, nn

from batchfold.data.conllu import Sentence
from batchfold.models.biaffine import BiaffineParser, decode, parse, sentence_loss
from batchfold.schedule import Scheduler
from batchfold.training.parser import (
    add_common_arguments,
    apply_predicted_tags,
    check_tag_options,
    parse_metrics,
)
from batchfold.training.ud import (
    UDSplits,
    UDTask,
    add_option,
    describe_splits,
    expect_model,
    glove_vectors,
    load_splits,
    start_word_vectors,
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
        model_options: :class:`~batchfold.models.biaffine.BiaffineParser`'s sizes and
            dropouts by name: ``word_dim`` (required), ``pos_dim``, ``hidden``, ``layers``,
            ``arc_dim``, ``label_dim``, ``dropout``, ``word_dropout``, ``tag_dropout``.
        glove: start the word vectors from GloVe (as the ``parser`` job's ``glove``).
        seed: the seed of the random vectors of words GloVe lacks.
        eval_batch: sentences per ``batch_map`` call when evaluating.
        scheduler: ``batch_map``'s scheduler.
    """

    name = "biaffine"
    best_metric = "dev_uas"
    model_class = BiaffineParser

    def __init__(
        self,
        splits: UDSplits,
        model_options: Mapping[str, Any],
        *,
        glove: str | None = None,
        seed: int = 0,
        eval_batch: int = 512,
        scheduler: Scheduler = "agenda",
    ) -> None:
        super().__init__(splits, splits.train, eval_batch, scheduler)
        self.model_options = dict(model_options)
        word_dim = self.model_options["word_dim"]
        self.vectors, self.glove_words = glove_vectors(self.vocabs, glove, word_dim, seed)

    def train_items(self) -> Sequence[Sentence]:
        """Every training sentence (non-projective ones too)."""
        return self.splits.train

    def build_model(self) -> nn.Module:
        """A freshly initialised :class:`~batchfold.models.biaffine.BiaffineParser`."""
        model = BiaffineParser(self.vocabs, **self.model_options, word_counts=self.word_counts)
        start_word_vectors(model.word_embedding, self.vectors)
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
        ConfigError: ``--predicted-tags`` with ``--pos-dim 0``, or a file that is not a usable
            tagger checkpoint.
    """
    check_tag_options(args)
    options = ("word_dim", "pos_dim", "hidden", "layers", "arc_dim", "label_dim", "dropout")
    options += ("word_dropout", "tag_dropout")
    task = BiaffineTask(
        load_splits(args),
        {name: getattr(args, name) for name in options},
        glove=args.glove,
        seed=args.seed,
        eval_batch=args.eval_batch_size,
        scheduler=getattr(args, "scheduler", "agenda"),
    )
    if task.glove_words is not None:
        args.glove_words = task.glove_words  # recorded in config.json
    apply_predicted_tags(task, args)
    v = task.vocabs
    print(
        f"biaffine: {describe_splits(task.splits)}; {len(v.words)} words, "
        f"{len(v.deprels)} relations"
    )
    return task
