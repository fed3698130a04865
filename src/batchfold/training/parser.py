"""The ``parser`` job: an arc-hybrid BiLSTM parser on UD English-EWT (``batchfold train parser``).

Training uses the static oracle (:func:`~batchfold.models.parser.sentence_loss`) or, with
``--oracle dynamic``, the dynamic oracle with exploration
(:func:`~batchfold.models.parser.exploring_loss`), run over each batch with
:func:`batchfold.batch_map`. Non-projective training sentences are skipped (the arc-hybrid
system cannot build them) and counted; dev and test keep every sentence. Evaluation decodes
greedily with :func:`~batchfold.models.parser.parse`, whose per-transition reads are sync
points, so a whole batch of sentences is decoded together.

Metrics: ``dev_uas``, ``dev_las`` (and ``test_...``) in percent, over every word,
punctuation included, relations compared with their subtypes. The number of skipped
training sentences is printed when the task is made and kept as
:attr:`ParserTask.skipped_nonprojective`. UPOS tags, when the model uses them
(``--pos-dim``, 25 by default as in Kiperwasser and Goldberg), are the treebank's gold tags,
unless ``--predicted-tags PATH`` names a tagger checkpoint: then dev and test are tagged by it
once, when the task is made (:mod:`batchfold.training.predicted_tags`), training keeps gold
tags, and the tagger's accuracy on the tags the parser reads is reported with the parser's
metrics (``dev_tagger_upos``, ``test_tagger_upos``) and kept in the config
(``predicted_tags_upos``). Adam (learning rate 0.001) is the default optimizer.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from batchfold.data.conllu import Sentence
from batchfold.errors import ConfigError
from batchfold.models.attachment import attachment_scores
from batchfold.models.parser import ArcHybridParser, exploring_loss, parse, sentence_loss
from batchfold.schedule import Scheduler
from batchfold.training.predicted_tags import add_predicted_tags_argument, predict_splits
from batchfold.training.ud import (
    UDSplits,
    UDTask,
    add_glove_argument,
    add_option,
    add_ud_arguments,
    add_word_dropout_argument,
    describe_splits,
    expect_model,
    glove_vectors,
    load_splits,
    start_word_vectors,
)

__all__ = [
    "ParserTask",
    "add_arguments",
    "add_common_arguments",
    "apply_predicted_tags",
    "check_tag_options",
    "make_task",
    "parse_metrics",
]


def add_common_arguments(parser: argparse.ArgumentParser, pos_dim: int, hidden: int) -> None:
    """The options every parser job takes: the UD data, word and tag vectors, predicted tags,
    the BiLSTM, word and tag dropout.

    Arguments:
        parser: the parser of ``batchfold train parser`` or ``biaffine``.
        pos_dim: the default UPOS vector size.
        hidden: the default BiLSTM size per direction.
    """
    add_ud_arguments(parser)
    add_option(
        parser,
        "--word-dim",
        type=int,
        default=150,
        help="word vector size; with GloVe, 50, 100 or 150 (50d and 100d side by side)",
    )
    add_glove_argument(parser, "data")
    add_option(
        parser, "--pos-dim", type=int, default=pos_dim, help="UPOS vector size; 0 turns tags off"
    )
    add_predicted_tags_argument(parser)
    add_option(parser, "--hidden", type=int, default=hidden, help="BiLSTM size per direction")
    add_option(parser, "--layers", type=int, default=2, help="BiLSTM layers")
    add_word_dropout_argument(parser)
    add_option(
        parser,
        "--tag-dropout",
        type=float,
        default=0.1,
        help="chance that a training token's UPOS tag is read as unknown",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The parser's command line options (plus the UD data options).

    Arguments:
        parser: the parser of ``batchfold train parser``.
    """
    add_common_arguments(parser, pos_dim=25, hidden=125)
    add_option(parser, "--mlp-hidden", type=int, default=100, help="MLP hidden layer size")
    add_option(
        parser,
        "--oracle",
        choices=("static", "dynamic"),
        default="static",
        help="training oracle: static (gold transitions) or dynamic with exploration",
    )
    add_option(
        parser,
        "--explore",
        type=float,
        default=0.9,
        help="dynamic oracle: probability of following the parser's own wrong transition",
    )
    # the best settings on dev (results/parser-glove-tagdrop-seed0; seed 1 beside it)
    parser.set_defaults(optimizer="adam", batch_size=32, epochs=20, lr_schedule="cosine")


class ParserTask(UDTask[ArcHybridParser]):
    """An arc-hybrid BiLSTM parser on UD English-EWT, for the generic training loop.

    Arguments:
        splits: the train, dev and test sentences.
        word_dim: the word vector size.
        pos_dim: the UPOS vector size; 0 turns tags off.
        hidden: the BiLSTM size per direction.
        layers: the number of BiLSTM layers.
        mlp_hidden: the MLP hidden layer size.
        word_dropout: the word dropout ``alpha``.
        tag_dropout: the chance that a training token's tag is read as unknown.
        glove: start the word vectors from the GloVe vectors in this file or folder (``"data"``:
            the project's data folder), or ``None`` (or ``"none"``) for random ones.
        seed: the seed of the random vectors of words GloVe lacks.
        oracle: ``"static"`` or ``"dynamic"``.
        explore: with the dynamic oracle, the probability of following a wrong prediction.
        eval_batch: sentences per ``batch_map`` call when evaluating.
        scheduler: ``batch_map``'s scheduler.
        tagger_upos: when dev and test carry predicted tags, the tagger's accuracy on them by
            split, reported with each evaluation as ``{split}_tagger_upos``.

    Raises:
        ValueError: no training sentence is projective, or an unknown oracle.
    """

    name = "parser"
    best_metric = "dev_uas"
    model_class = ArcHybridParser

    def __init__(
        self,
        splits: UDSplits,
        *,
        word_dim: int = 100,
        pos_dim: int = 25,
        hidden: int = 125,
        layers: int = 2,
        mlp_hidden: int = 100,
        word_dropout: float = 0.25,
        tag_dropout: float = 0.0,
        glove: str | None = None,
        seed: int = 0,
        oracle: str = "static",
        explore: float = 0.9,
        eval_batch: int = 512,
        scheduler: Scheduler = "agenda",
        tagger_upos: Mapping[str, float] | None = None,
    ) -> None:
        if oracle not in ("static", "dynamic"):
            raise ValueError(f"expected oracle 'static' or 'dynamic', found {oracle!r}")
        self.projective = [s for s in splits.train if s.is_projective]
        self.skipped_nonprojective = len(splits.train) - len(self.projective)
        """How many training sentences were left out for crossing arcs."""
        if not self.projective:
            raise ValueError(
                f"expected at least one projective training sentence, found none among "
                f"{len(splits.train)}"
            )
        super().__init__(splits, self.projective, eval_batch, scheduler)
        self.sizes = {
            "word_dim": word_dim,
            "pos_dim": pos_dim,
            "hidden": hidden,
            "layers": layers,
            "mlp_hidden": mlp_hidden,
        }
        self.word_dropout = word_dropout
        self.tag_dropout = tag_dropout
        # how many words GloVe covers, recorded in config.json
        self.vectors, self.glove_words = glove_vectors(self.vocabs, glove, word_dim, seed)
        self.oracle = oracle
        self.explore = explore
        self.tagger_upos = dict(tagger_upos) if tagger_upos is not None else None

    def train_items(self) -> Sequence[Sentence]:
        """The projective training sentences.

        Returns:
            The training sentences without the :attr:`skipped_nonprojective` ones.
        """
        return self.projective

    def build_model(self) -> nn.Module:
        """A freshly initialised :class:`~batchfold.models.parser.ArcHybridParser`.

        Returns:
            The model.
        """
        model = ArcHybridParser(
            self.vocabs,
            **self.sizes,
            word_counts=self.word_counts,
            word_dropout=self.word_dropout,
            tag_dropout=self.tag_dropout,
        )
        start_word_vectors(model.word_embedding, self.vectors)
        return model

    def summed_loss(
        self, model: ArcHybridParser, batch: Sequence[Sentence], batched: bool
    ) -> tuple[Tensor, int]:
        """The summed cross-entropy of every transition of a batch.

        Arguments:
            model: the parser.
            batch: projective training sentences.
            batched: run with ``batch_map``, else one sentence at a time.

        Returns:
            ``(loss, number of transitions)``.
        """
        if self.oracle == "dynamic":
            explore = partial(exploring_loss, model, explore=self.explore)
            explored = self.each(explore, batch, batched)
            return torch.stack([loss for loss, _ in explored]).sum(), sum(n for _, n in explored)
        losses = self.each(partial(sentence_loss, model), batch, batched)
        return torch.stack(losses).sum(), sum(2 * len(s) for s in batch)

    def evaluate(self, model: nn.Module, split: str) -> dict[str, float]:
        """UAS and LAS in percent of greedy parsing over every word (punctuation included).

        Arguments:
            model: the parser.
            split: ``"dev"`` or ``"test"``.

        Returns:
            ``{f"{split}_uas": uas, f"{split}_las": las}``, and ``f"{split}_tagger_upos"``
            when the split's tags were predicted.
        """
        parser: ArcHybridParser = expect_model(model, ArcHybridParser)
        sentences, parsed = self.predict(parser, parse, split)
        return parse_metrics(split, sentences, parsed, self.tagger_upos)


def parse_metrics(
    split: str,
    sentences: Sequence[Sentence],
    parsed: Sequence[tuple[Sequence[int], Sequence[str]]],
    tagger_upos: Mapping[str, float] | None,
) -> dict[str, float]:
    """A parser's metrics on a split: UAS and LAS in percent over every word.

    Arguments:
        split: ``"dev"`` or ``"test"``.
        sentences: the split's gold sentences.
        parsed: ``(heads, relations)`` of each sentence.
        tagger_upos: when the split's tags were predicted, the tagger's accuracy by split.

    Returns:
        ``{f"{split}_uas": uas, f"{split}_las": las}``, and ``f"{split}_tagger_upos"`` with
        ``tagger_upos``.
    """
    uas, las = attachment_scores(
        [heads for heads, _ in parsed], [labels for _, labels in parsed], sentences
    )
    metrics = {f"{split}_uas": 100.0 * uas, f"{split}_las": 100.0 * las}
    if tagger_upos is not None:
        metrics[f"{split}_tagger_upos"] = tagger_upos[split]
    return metrics


def make_task(args: argparse.Namespace) -> ParserTask:
    """The parser job configured by the options of :func:`add_arguments`.

    With ``--predicted-tags``, the tagger's accuracy on dev and test is also written to
    ``args.predicted_tags_upos``, which the loop records in ``config.json``.

    Arguments:
        args: the parsed command line.

    Returns:
        The task.

    Raises:
        ConfigError: ``--predicted-tags`` with ``--pos-dim 0``, or a file that is not a usable
            tagger checkpoint.
    """
    check_tag_options(args)
    task = ParserTask(
        load_splits(args),
        word_dim=args.word_dim,
        pos_dim=args.pos_dim,
        hidden=args.hidden,
        layers=args.layers,
        mlp_hidden=args.mlp_hidden,
        word_dropout=args.word_dropout,
        tag_dropout=args.tag_dropout,
        glove=args.glove,
        seed=args.seed,
        oracle=args.oracle,
        explore=args.explore,
        eval_batch=args.eval_batch_size,
        scheduler=getattr(args, "scheduler", "agenda"),
    )
    if task.glove_words is not None:
        args.glove_words = task.glove_words  # recorded in config.json
    apply_predicted_tags(task, args)
    print(
        f"parser: {describe_splits(task.splits)}; skipped {task.skipped_nonprojective} "
        f"non-projective training sentences, training on {len(task.projective)}; "
        f"{len(task.vocabs.words)} words, {len(task.vocabs.deprels)} relations"
    )
    return task


def check_tag_options(args: argparse.Namespace) -> None:
    """Refuse ``--predicted-tags`` for a parser that reads no tags, before any data loads.

    Raises:
        ConfigError: ``--predicted-tags`` with ``--pos-dim 0``.
    """
    path = getattr(args, "predicted_tags", None)
    if path is not None and args.pos_dim == 0:
        raise ConfigError(f"--predicted-tags {path}: the parser reads no tags (--pos-dim 0)")


def apply_predicted_tags(task: UDTask[Any], args: argparse.Namespace) -> None:
    """Put ``--predicted-tags``' tags on a parser task's dev and test sentences.

    Without the option this changes nothing. With it, the task's splits are replaced, its
    ``tagger_upos`` set, ``args.predicted_tags_upos`` written (the loop records it in
    ``config.json``) and a line about the tags printed.

    Arguments:
        task: a parser task.
        args: the parsed command line.

    Raises:
        ConfigError: a file that is not a usable tagger checkpoint.
    """
    path = getattr(args, "predicted_tags", None)
    if path is not None:
        path = args.predicted_tags = str(Path(path).resolve())  # config.json: from anywhere
        saved = getattr(args, "predicted_tags_upos", None)  # batchfold eval: the run's
        predicted = predict_splits(
            path,
            task.splits,
            task.vocabs.upos,
            device=getattr(args, "device", "cpu"),
            eval_batch=task.eval_batch,
            scheduler=task.scheduler,
        )
        task.splits = predicted.splits
        task.tagger_upos = predicted.accuracy
        args.predicted_tags_upos = predicted.accuracy  # recorded in config.json
        print(_describe_predicted(predicted.path, predicted.accuracy, predicted.unknown_tags))
        if saved and any(abs(saved[k] - predicted.accuracy[k]) > 1e-6 for k in saved):
            print(
                f"parser: warning: the tagger at {path} tags these splits otherwise than when "
                f"the parser was trained (dev {saved['dev']:.2f} then, "
                f"{predicted.accuracy['dev']:.2f} now): another tagger, or other splits?"
            )


def _describe_predicted(path: str, accuracy: Mapping[str, float], unknown: Sequence[str]) -> str:
    unseen = f"; tags the parser never saw in training: {', '.join(unknown)}" if unknown else ""
    return (
        f"parser: dev and test UPOS tags predicted by {path} (its accuracy on them: dev "
        f"{accuracy['dev']:.2f}, test {accuracy['test']:.2f}); training uses gold tags{unseen}"
    )
