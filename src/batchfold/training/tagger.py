"""The ``tagger`` job: a BiLSTM UPOS tagger on UD English-EWT (``batchfold train tagger``).

Training runs :func:`~batchfold.models.tagger.sentence_losses` over each batch with
:func:`batchfold.batch_map`; evaluation runs :func:`~batchfold.models.tagger.predict_tags`
the same way under ``torch.no_grad()``, over large batches of sentences of similar length.
The metric is UPOS accuracy in percent over every word, punctuation included (``dev_upos``,
``test_upos``). The UD data helpers, shared with the ``parser`` job, live in
:mod:`batchfold.training.ud` and are importable from here as well.

The generic loop (:mod:`batchfold.training.loop`) provides ``--max-train``, ``--max-eval``,
``--scheduler``, ``--device`` and ``--seed``; this module adds the data folder and the
model's sizes, and makes Adam (learning rate 0.001) the default optimizer.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from functools import partial

import torch
from torch import Tensor, nn

from batchfold.data.conllu import Sentence
from batchfold.data.vocab import LabelSet
from batchfold.models.tagger import BiLSTMTagger, predict_tags, sentence_losses
from batchfold.schedule import Scheduler
from batchfold.training.ud import (
    UDSplits,
    UDTask,
    add_glove_argument,
    add_option,
    add_ud_arguments,
    add_word_dropout_argument,
    batched_predictions,
    describe_splits,
    expect_model,
    glove_vectors,
    load_splits,
    start_word_vectors,
    word_counts,
)

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
    "upos_accuracy",
    "word_counts",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The tagger's command line options (plus :func:`add_ud_arguments`).

    Arguments:
        parser: the parser of ``batchfold train tagger``.
    """
    add_ud_arguments(parser)
    add_option(
        parser,
        "--word-dim",
        type=int,
        default=150,
        help="word vector size; with GloVe, 50, 100 or 150 (50d and 100d side by side) "
        "(default: %(default)s)",
    )
    add_glove_argument(parser, "data")
    add_option(
        parser,
        "--char-dim",
        type=int,
        default=50,
        help="character vector and character LSTM size per direction; 0 turns characters off",
    )
    add_option(parser, "--hidden", type=int, default=125, help="BiLSTM size per direction")
    add_option(parser, "--layers", type=int, default=2, help="BiLSTM layers")
    add_word_dropout_argument(parser)
    # the best settings on dev (results/tagger-glove150-l2)
    parser.set_defaults(optimizer="adam", batch_size=32, epochs=12, lr_schedule="cosine")


class TaggerTask(UDTask[BiLSTMTagger]):
    """A BiLSTM UPOS tagger on UD English-EWT, for the generic training loop.

    Arguments:
        splits: the train, dev and test sentences.
        word_dim: the word vector size.
        char_dim: the character vector and character LSTM size; 0 turns characters off.
        hidden: the BiLSTM size per direction.
        layers: the number of BiLSTM layers.
        word_dropout: the word dropout ``alpha``.
        glove: start the word vectors from the GloVe vectors in this file or folder (``"data"``:
            the project's data folder), or ``None`` (or ``"none"``) for random ones.
        seed: the seed of the random vectors of words GloVe lacks.
        eval_batch: sentences per ``batch_map`` call when evaluating.
        scheduler: ``batch_map``'s scheduler.

    Raises:
        ValueError: there are no training sentences.
    """

    name = "tagger"
    best_metric = "dev_upos"
    model_class = BiLSTMTagger

    def __init__(
        self,
        splits: UDSplits,
        *,
        word_dim: int = 100,
        char_dim: int = 50,
        hidden: int = 125,
        layers: int = 1,
        word_dropout: float = 0.25,
        glove: str | None = None,
        seed: int = 0,
        eval_batch: int = 512,
        scheduler: Scheduler = "agenda",
    ) -> None:
        if not splits.train:
            raise ValueError("expected at least one training sentence, found none")
        super().__init__(splits, splits.train, eval_batch, scheduler)
        self.sizes = {"word_dim": word_dim, "char_dim": char_dim, "hidden": hidden}
        self.layers = layers
        self.word_dropout = word_dropout
        # how many words GloVe covers, recorded in config.json
        self.vectors, self.glove_words = glove_vectors(self.vocabs, glove, word_dim, seed)

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
        model = BiLSTMTagger(
            self.vocabs,
            **self.sizes,
            layers=self.layers,
            word_counts=self.word_counts,
            word_dropout=self.word_dropout,
        )
        start_word_vectors(model.word_embedding, self.vectors)
        return model

    def summed_loss(
        self, model: BiLSTMTagger, batch: Sequence[Sentence], batched: bool
    ) -> tuple[Tensor, int]:
        """The summed cross-entropy of every word of a batch.

        Arguments:
            model: the tagger.
            batch: training sentences.
            batched: run with ``batch_map``, else one sentence at a time.

        Returns:
            ``(loss, number of words)``.
        """
        per_sentence = self.each(partial(sentence_losses, model), batch, batched)
        losses = [loss for sentence in per_sentence for loss in sentence]
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
        sentences, predicted = self.predict(tagger, predict_tags, split)
        try:
            return {f"{split}_upos": upos_accuracy(tagger.vocabs.upos, sentences, predicted)}
        except ValueError as error:
            raise ValueError(f"tagger {split}: {error}") from None


def upos_accuracy(
    tags: LabelSet, sentences: Sequence[Sentence], predicted: Sequence[Sequence[int]]
) -> float:
    """The accuracy in percent of predicted tag ids against the sentences' gold UPOS tags.

    Arguments:
        tags: the tagger's tag set, which decodes the ids.
        sentences: the sentences, with their gold tags.
        predicted: one list of tag ids per sentence, as :func:`predict_tags` gives.

    Returns:
        The share of words whose predicted tag is the gold one, over every word.

    Raises:
        ValueError: there are no words (an empty split scores nothing, not 0).
    """
    right = total = 0
    for sentence, ids in zip(sentences, predicted, strict=True):
        right += sum(p == g for p, g in zip(tags.decode(ids), sentence.upos, strict=True))
        total += len(sentence)
    if not total:
        raise ValueError(
            f"UPOS accuracy of {len(sentences)} sentences with no words: nothing to evaluate "
            "(an empty data file, or --max-eval 0)"
        )
    return 100.0 * right / total


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
        glove=args.glove,
        seed=args.seed,
        eval_batch=args.eval_batch_size,
        scheduler=getattr(args, "scheduler", "agenda"),
    )
    if task.glove_words is not None:
        args.glove_words = task.glove_words  # recorded in config.json
    v = task.vocabs
    print(
        f"tagger: {describe_splits(task.splits)}; {len(v.words)} words, {len(v.chars)} "
        f"characters, {len(v.upos)} tags"
    )
    return task
