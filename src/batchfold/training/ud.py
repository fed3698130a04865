"""What the ``tagger`` and ``parser`` jobs share: UD English-EWT data, options and evaluation.

:func:`add_ud_arguments` and :func:`load_splits` read the treebank's three splits;
:class:`UDTask` is the part of both tasks that does not depend on the model: vocabularies and
word counts built from the training sentences, one parameter group, the batched and the
one-at-a-time loss, and predictions over a split in large batches of sentences of similar
length (:func:`batched_predictions`). The shared options are defined in
:mod:`batchfold.training.ud_arguments` and importable from here as well;
:mod:`batchfold.training.tagger` re-exports the data helpers under the same names.
"""

from __future__ import annotations

import abc
import argparse
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, TypeVar

import torch
from torch import Tensor, nn

import batchfold as bf
from batchfold.data.conllu import Sentence
from batchfold.data.glove import word_vectors
from batchfold.data.ud import Split, UDVocabs, build_vocabs, load_ud
from batchfold.schedule import Scheduler
from batchfold.training.ud_arguments import (
    add_glove_argument,
    add_option,
    add_ud_arguments,
    add_word_dropout_argument,
)

__all__ = [
    "UDSplits",
    "UDTask",
    "add_glove_argument",
    "add_option",
    "add_ud_arguments",
    "add_word_dropout_argument",
    "batched_predictions",
    "describe_splits",
    "expect_model",
    "glove_vectors",
    "load_splits",
    "start_word_vectors",
    "word_counts",
]

T = TypeVar("T")
M = TypeVar("M", bound=nn.Module)


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


def glove_vectors(
    vocabs: UDVocabs, glove: str | None, word_dim: int, seed: int
) -> tuple[Tensor | None, dict[str, int] | None]:
    """The GloVe start of a model's word vectors, as ``--glove`` names it.

    Arguments:
        vocabs: the model's index maps (one vector row per word id).
        glove: a GloVe file or folder, ``"data"`` for the project's data folder, or ``None``
            (or ``"none"``) for random vectors.
        word_dim: the word vector size (50, 100, or 150 for 50d and 100d side by side).
        seed: the seed of the random vectors of words GloVe lacks.

    Returns:
        ``(vectors, coverage)``: the ``[len(vocabs.words), word_dim]`` matrix and how many
        words have a vector, or ``(None, None)`` for random vectors.

    Raises:
        FileNotFoundError: no GloVe file of that size was found; the message names the option.
    """
    if glove is None or glove.lower() == "none":
        return None, None
    try:
        return word_vectors(vocabs.words, None if glove == "data" else glove, word_dim, seed)
    except FileNotFoundError as err:
        raise FileNotFoundError(
            f"{err} On the command line: --glove PATH, or --glove none for random vectors."
        ) from err


def start_word_vectors(embedding: nn.Embedding, vectors: Tensor | None) -> None:
    """Copy :func:`glove_vectors`' matrix into the first rows of a word embedding (rows past
    them, such as a parser's root token, keep their random start); ``None`` leaves it."""
    if vectors is not None:
        with torch.no_grad():
            embedding.weight[: len(vectors)].copy_(vectors)


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


def describe_splits(splits: UDSplits) -> str:
    """A short line of sentence counts, for the log.

    Arguments:
        splits: the splits.

    Returns:
        Such as ``"12544 train, 2001 dev, 2077 test sentences"``.
    """
    return f"{len(splits.train)} train, {len(splits.dev)} dev, {len(splits.test)} test sentences"


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


class UDTask(abc.ABC, Generic[M]):
    """The model-independent part of a task on UD sentences, for the generic training loop.

    A subclass sets ``name``, ``best_metric`` and ``model_class`` (the class its
    ``build_model`` makes), and defines ``build_model``, :meth:`summed_loss` and
    ``evaluate`` (with :meth:`predict`).

    Arguments:
        splits: the train, dev and test sentences.
        train: the sentences to train on, from which the vocabularies and the word counts
            are built.
        eval_batch: sentences per ``batch_map`` call when evaluating.
        scheduler: ``batch_map``'s scheduler.
    """

    unit = "sentences"
    model_class: type[M]
    tagger_upos: dict[str, float] | None = None
    """A parser's: the tagger's accuracy by split when dev and test carry predicted tags."""

    def __init__(
        self, splits: UDSplits, train: list[Sentence], eval_batch: int, scheduler: Scheduler
    ) -> None:
        self.splits = splits
        self.vocabs = build_vocabs(train)
        self.word_counts = word_counts(train, self.vocabs)
        self.eval_batch = eval_batch
        self.scheduler: Scheduler = scheduler

    def param_groups(self, model: nn.Module, lr: float) -> list[dict[str, Any]]:
        """One group with every parameter at ``lr``.

        Arguments:
            model: the model.
            lr: the learning rate.

        Returns:
            The optimizer's parameter groups.
        """
        return [{"params": list(model.parameters()), "lr": lr}]

    @abc.abstractmethod
    def summed_loss(self, model: M, batch: Sequence[Sentence], batched: bool) -> tuple[Tensor, int]:
        """The summed loss of a batch of training sentences and the number of terms it sums.

        Arguments:
            model: the model.
            batch: training sentences.
            batched: run the single-sentence code with ``batch_map`` (:meth:`each`).

        Returns:
            ``(loss, number of terms)``.
        """

    def each(
        self, fn: Callable[[Sentence], T], batch: Sequence[Sentence], batched: bool
    ) -> list[T]:
        """``[fn(s) for s in batch]``, with ``batch_map`` when ``batched``, else eagerly.

        Arguments:
            fn: single-sentence code.
            batch: the sentences.
            batched: whether to run them with ``batch_map`` (and :attr:`scheduler`).

        Returns:
            One result per sentence.
        """
        if batched:
            return bf.batch_map(fn, batch, scheduler=self.scheduler)
        return [fn(s) for s in batch]

    def loss(self, model: nn.Module, batch: Sequence[Any]) -> tuple[Tensor, int]:
        """:meth:`summed_loss` of a batch, computed with ``batch_map``.

        Arguments:
            model: the task's model.
            batch: training sentences.

        Returns:
            ``(loss, number of terms)``.
        """
        return self.summed_loss(expect_model(model, self.model_class), batch, batched=True)

    def eager_loss(self, model: nn.Module, batch: Sequence[Any]) -> tuple[Tensor, int]:
        """:meth:`loss` computed one sentence at a time in plain PyTorch (the same code)."""
        return self.summed_loss(expect_model(model, self.model_class), batch, batched=False)

    def predict(
        self, model: M, fn: Callable[[M, Sentence], T], split: str
    ) -> tuple[list[Sentence], list[T]]:
        """``fn(model, s)`` for every sentence ``s`` of a split, in eval mode, batched.

        Runs :func:`batched_predictions` in batches of :attr:`eval_batch` and puts the
        model's training mode back afterwards.

        Arguments:
            model: the model.
            fn: single-sentence prediction code, such as ``predict_tags``.
            split: ``"dev"`` or ``"test"``.

        Returns:
            ``(the split's sentences, one prediction per sentence)``.
        """
        sentences = self.splits.split(split)
        was_training = model.training
        model.eval()
        try:
            predicted = batched_predictions(
                partial(fn, model), sentences, self.eval_batch, self.scheduler
            )
        finally:
            model.train(was_training)
        return sentences, predicted
