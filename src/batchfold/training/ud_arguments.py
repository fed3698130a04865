"""The command-line options the ``tagger`` and ``parser`` jobs share.

:func:`add_ud_arguments` adds where UD English-EWT is and how much of it to use;
:func:`add_word_dropout_argument` and :func:`add_glove_argument` the BiLSTM models' word
options. Each adds its options with :func:`add_option`, which keeps an option the parser has
already, so that the jobs can share a parser with the generic command line.
"""

from __future__ import annotations

import argparse
import contextlib
from typing import Any

from batchfold.training.arguments import at_least_one

__all__ = [
    "add_glove_argument",
    "add_option",
    "add_ud_arguments",
    "add_word_dropout_argument",
]


def add_option(parser: argparse.ArgumentParser, *flags: str, **kwargs: Any) -> None:
    """``parser.add_argument(*flags, **kwargs)``, unless the parser has the option already.

    The generic command line may define an option (``--max-train``) before a task adds it.

    Arguments:
        parser: the parser to extend.
        flags: the option strings.
        kwargs: what ``add_argument`` takes.
    """
    text = kwargs.get("help")
    if text and "%(default)" not in text and kwargs.get("default") is not None:
        kwargs["help"] = f"{text} (default: %(default)s)"  # as every other task's help says
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
        type=at_least_one,
        default=512,
        help="sentences per batch_map call when evaluating",
    )


def add_word_dropout_argument(parser: argparse.ArgumentParser) -> None:
    """The ``--word-dropout`` option (alpha, 0.25 by default) of the BiLSTM models.

    Arguments:
        parser: the command line parser to extend.
    """
    add_option(
        parser,
        "--word-dropout",
        type=float,
        default=0.25,
        help="word dropout alpha: a word seen c times becomes <unk> with p = alpha/(alpha+c)",
    )


def add_glove_argument(parser: argparse.ArgumentParser, default: str) -> None:
    """The ``--glove`` option: where the word vectors start from.

    Arguments:
        parser: the command line parser to extend.
        default: ``"data"`` (the glove-sst data folder) or ``"none"`` (random vectors).
    """
    add_option(
        parser,
        "--glove",
        default=default,
        metavar="PATH",
        help="start the word vectors from GloVe: a file, a folder, 'data' for the glove-sst "
        "data folder, or 'none' for random vectors; words without a vector keep the random "
        "initialisation (default: %(default)s)",
    )
