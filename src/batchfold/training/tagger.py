"""The ``tagger`` job: a BiLSTM UPOS tagger on UD English-EWT (``batchfold train tagger``).

Training runs :func:`~batchfold.models.tagger.sentence_losses` over each batch with
:func:`batchfold.batch_map`; evaluation runs :func:`~batchfold.models.tagger.predict_tags`
the same way under ``torch.no_grad()``, over large batches of sentences of similar length.
The metric is UPOS accuracy in percent over every word, punctuation included (``dev_upos``,
``test_upos``). The UD data helpers here are shared with the ``parser`` job.

The generic loop (:mod:`batchfold.training.loop`) provides ``--max-train``, ``--max-eval``,
``--scheduler``, ``--device`` and ``--seed``; this module adds the data folder and the
model's sizes, and makes Adam (learning rate 0.001) the default optimizer.
"""

from __future__ import annotations

import argparse
import contextlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

import batchfold as bf
from batchfold.data.conllu import Sentence, Split, UDVocabs, build_vocabs, load_ud
from batchfold.models.tagger import BiLSTMTagger, predict_tags, sentence_losses
from batchfold.schedule import Scheduler

__all__ = [
    "TaggerTask",
    "UDSplits",
    "add_arguments",
    "add_option",
    "add_ud_arguments",
    "batched_predictions",
    "describe_splits",
    "expect_model",
    "load_splits",
    "make_task",
    "word_counts",
]

T = TypeVar("T")


@dataclass(frozen=True)
class UDSplits:
    """The three splits of a treebank, as read for a job.

    Arguments:
        train: the training sentences.
        dev: the development sentences.
        test: the test sentences.
    """

    train: list[Sentence]
    dev: list[Sentence]
    test: list[Sentence]

    def split(self, name: str) -> list[Sentence]:
        """The sentences of ``"train"``, ``"dev"`` or ``"test"``.

        Arguments:
            name: the split.

        Returns:
            Its sentences.

        Raises:
            ValueError: an unknown split name.
        """
        if name not in ("train", "dev", "test"):
            raise ValueError(f"expected a split among train, dev, test, found {name!r}")
        return getattr(self, name)


def add_option(parser: argparse.ArgumentParser, *flags: str, **kwargs: Any) -> None:
    """``parser.add_argument(*flags, **kwargs)``, unless the parser has the option already.

    The generic command line may define an option (``--max-train``) before a task adds it.

    Arguments:
        parser: the parser to extend.
        flags: the option strings.
        kwargs: what ``add_argument`` takes.
    """
    with contextlib.suppress(argparse.ArgumentError):  # a conflict: it is defined already
        parser.add_argument(*flags, **kwargs)


def add_ud_arguments(parser: argparse.ArgumentParser) -> None:
    """Options for reading UD English-EWT: where it is, and how much of it to use.

    Arguments:
        parser: the command line parser to extend; options it has already are kept.
    """
    add_option(
        parser,
        "--data",
        default=None,
        help="folder with en_ewt-ud-{train,dev,test}.conllu[.gz] (default: search shared/data)",
    )
    add_option(
        parser, "--max-train", type=int, default=None, help="use the first N training sentences"
    )
    add_option(
        parser,
        "--max-eval",
        type=int,
        default=None,
        help="evaluate on the first N dev and test sentences",
    )
    add_option(
        parser,
        "--eval-batch-size",
        type=int,
        default=512,
        help="sentences per batch_map call when evaluating",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The tagger's command line options (plus :func:`add_ud_arguments`).

    Arguments:
        parser: the parser of ``batchfold train tagger``.
    """
    add_ud_arguments(parser)
    add_option(parser, "--word-dim", type=int, default=100, help="word vector size")
    add_option(
        parser,
        "--char-dim",
        type=int,
        default=50,
        help="character vector and character LSTM size per direction; 0 turns characters off",
    )
    add_option(parser, "--hidden", type=int, default=125, help="BiLSTM size per direction")
    add_option(parser, "--layers", type=int, default=1, help="BiLSTM layers")
    add_option(
        parser,
        "--word-dropout",
        type=float,
        default=0.25,
        help="word dropout alpha: a word seen c times becomes <unk> with p = alpha/(alpha+c)",
    )
    parser.set_defaults(optimizer="adam", batch_size=32, epochs=20)


def _limit(items: list[T], limit: int | None) -> list[T]:
    return items if limit is None else items[: max(limit, 0)]


def load_splits(args: argparse.Namespace) -> UDSplits:
    """Read the three splits named by the options of :func:`add_ud_arguments`.

    Arguments:
        args: the parsed options (``data``, ``max_train``, ``max_eval``).

    Returns:
        The splits, cut to the requested sizes.
    """
    data = getattr(args, "data", None)

    def read(split: Split, limit: int | None) -> list[Sentence]:
        return _limit(load_ud(split, path=data), limit)

    max_eval = getattr(args, "max_eval", None)
    return UDSplits(
        train=read("train", getattr(args, "max_train", None)),
        dev=read("dev", max_eval),
        test=read("test", max_eval),
    )


def word_counts(sentences: Sequence[Sentence], vocabs: UDVocabs) -> list[int]:
    """How often each word id occurs in ``sentences`` (for word dropout).

    Arguments:
        sentences: the training sentences.
        vocabs: the index maps built from them.

    Returns:
        One count per word id; ``<unk>`` counts the words without an id of their own.

    Example:
        >>> s = Sentence(("a", "b", "a"), ("X",) * 3, (0, 1, 1), ("root", "dep", "dep"))
        >>> word_counts([s], build_vocabs([s]))
        [0, 2, 1]
    """
    counts = [0] * len(vocabs.words)
    for word, count in Counter(w for s in sentences for w in s.words).items():
        counts[vocabs.words.lookup(word)] += count
    return counts


def batched_predictions(
    fn: Callable[[Sentence], T],
    sentences: Sequence[Sentence],
    batch_size: int,
    scheduler: Scheduler = "agenda",
) -> list[T]:
    """``[fn(s) for s in sentences]``, run with ``batch_map`` under ``torch.no_grad()``.

    Sentences are grouped by length into batches of ``batch_size``, so that the sentences
    of a batch need about as many steps; results come back in the original order.

    Arguments:
        fn: single-sentence code, such as ``partial(predict_tags, model)``.
        sentences: the sentences.
        batch_size: the most sentences per ``batch_map`` call.
        scheduler: ``batch_map``'s scheduler.

    Returns:
        One result per sentence.

    Raises:
        ValueError: ``batch_size`` is below 1.
    """
    if batch_size < 1:
        raise ValueError(f"expected an evaluation batch size of at least 1, found {batch_size}")
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
    results: list[Any] = [None] * len(sentences)
    with torch.no_grad():
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            for i, out in zip(
                chunk,
                bf.batch_map(fn, [sentences[i] for i in chunk], scheduler=scheduler),
                strict=True,
            ):
                results[i] = out
    return results


def expect_model(model: nn.Module, kind: type[nn.Module]) -> Any:
    """``model`` itself, after checking that it is a ``kind`` (what ``build_model`` made).

    Arguments:
        model: the model the loop passed.
        kind: the class the task builds.

    Returns:
        ``model``.

    Raises:
        TypeError: ``model`` is something else.
    """
    if not isinstance(model, kind):
        raise TypeError(
            f"expected a {kind.__name__} (from this task's build_model), "
            f"found {type(model).__name__}"
        )
    return model


class TaggerTask:
    """A BiLSTM UPOS tagger on UD English-EWT, for the generic training loop.

    Arguments:
        splits: the train, dev and test sentences.
        word_dim: the word vector size.
        char_dim: the character vector and character LSTM size; 0 turns characters off.
        hidden: the BiLSTM size per direction.
        layers: the number of BiLSTM layers.
        word_dropout: the word dropout ``alpha``.
        eval_batch: sentences per ``batch_map`` call when evaluating.
        scheduler: ``batch_map``'s scheduler.

    Raises:
        ValueError: there are no training sentences.
    """

    name = "tagger"
    best_metric = "dev_upos"
    unit = "sentences"

    def __init__(
        self,
        splits: UDSplits,
        *,
        word_dim: int = 100,
        char_dim: int = 50,
        hidden: int = 125,
        layers: int = 1,
        word_dropout: float = 0.25,
        eval_batch: int = 512,
        scheduler: Scheduler = "agenda",
    ) -> None:
        if not splits.train:
            raise ValueError("expected at least one training sentence, found none")
        self.splits = splits
        self.vocabs = build_vocabs(splits.train)
        self.word_counts = word_counts(splits.train, self.vocabs)
        self.sizes = {"word_dim": word_dim, "char_dim": char_dim, "hidden": hidden}
        self.layers = layers
        self.word_dropout = word_dropout
        self.eval_batch = eval_batch
        self.scheduler: Scheduler = scheduler

    def train_items(self) -> Sequence[Sentence]:
        """The training sentences.

        Returns:
            Every training sentence.
        """
        return self.splits.train

    def build_model(self) -> nn.Module:
        """A freshly initialised :class:`~batchfold.models.tagger.BiLSTMTagger`.

        Returns:
            The model.
        """
        return BiLSTMTagger(
            self.vocabs,
            **self.sizes,
            layers=self.layers,
            word_counts=self.word_counts,
            word_dropout=self.word_dropout,
        )

    def param_groups(self, model: nn.Module, lr: float) -> list[dict[str, Any]]:
        """One group with every parameter at ``lr``.

        Arguments:
            model: the model.
            lr: the learning rate.

        Returns:
            The optimizer's parameter groups.
        """
        return [{"params": list(model.parameters()), "lr": lr}]

    def loss(self, model: nn.Module, batch: Sequence[Any]) -> tuple[Tensor, int]:
        """The summed cross-entropy of every word of a batch, computed with ``batch_map``.

        Arguments:
            model: the tagger.
            batch: training sentences.

        Returns:
            ``(loss, number of words)``.
        """
        tagger: BiLSTMTagger = expect_model(model, BiLSTMTagger)
        per_sentence = bf.batch_map(
            partial(sentence_losses, tagger), batch, scheduler=self.scheduler
        )
        losses = [loss for sentence in per_sentence for loss in sentence]
        return torch.stack(losses).sum(), len(losses)

    def eager_loss(self, model: nn.Module, batch: Sequence[Any]) -> tuple[Tensor, int]:
        """:meth:`loss` computed one sentence at a time in plain PyTorch (the same code).

        Arguments:
            model: the tagger.
            batch: training sentences.

        Returns:
            ``(loss, number of words)``.
        """
        tagger: BiLSTMTagger = expect_model(model, BiLSTMTagger)
        losses = [loss for sentence in batch for loss in sentence_losses(tagger, sentence)]
        return torch.stack(losses).sum(), len(losses)

    def evaluate(self, model: nn.Module, split: str) -> dict[str, float]:
        """UPOS accuracy in percent over every word of a split (punctuation included).

        Arguments:
            model: the tagger.
            split: ``"dev"`` or ``"test"``.

        Returns:
            ``{f"{split}_upos": accuracy}``; a gold tag never seen in training counts as wrong.
        """
        tagger: BiLSTMTagger = expect_model(model, BiLSTMTagger)
        sentences = self.splits.split(split)
        was_training = tagger.training
        tagger.eval()
        try:
            predicted = batched_predictions(
                partial(predict_tags, tagger), sentences, self.eval_batch, self.scheduler
            )
        finally:
            tagger.train(was_training)
        tags = tagger.vocabs.upos
        right = total = 0
        for sentence, ids in zip(sentences, predicted, strict=True):
            right += sum(p == g for p, g in zip(tags.decode(ids), sentence.upos, strict=True))
            total += len(sentence)
        return {f"{split}_upos": 100.0 * right / total if total else 0.0}


def make_task(args: argparse.Namespace) -> TaggerTask:
    """The tagger job configured by the options of :func:`add_arguments`.

    Arguments:
        args: the parsed command line.

    Returns:
        The task.
    """
    task = TaggerTask(
        load_splits(args),
        word_dim=args.word_dim,
        char_dim=args.char_dim,
        hidden=args.hidden,
        layers=args.layers,
        word_dropout=args.word_dropout,
        eval_batch=args.eval_batch_size,
        scheduler=getattr(args, "scheduler", "agenda"),
    )
    v = task.vocabs
    print(
        f"tagger: {describe_splits(task.splits)}; {len(v.words)} words, {len(v.chars)} "
        f"characters, {len(v.upos)} tags"
    )
    return task


def describe_splits(splits: UDSplits) -> str:
    """A short line of sentence counts, for the log.

    Arguments:
        splits: the splits.

    Returns:
        Such as ``"12544 train, 2001 dev, 2077 test sentences"``.
    """
    return f"{len(splits.train)} train, {len(splits.dev)} dev, {len(splits.test)} test sentences"
