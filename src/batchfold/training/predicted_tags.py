"""Predicted UPOS tags for the parser: ``--predicted-tags PATH``, a tagger checkpoint.

Published parsers are scored on tags predicted by a tagger, not on the treebank's gold tags.
:func:`predict_splits` loads a checkpoint written by ``batchfold train tagger`` the way
``batchfold eval tagger --checkpoint`` does (:func:`load_tagger`: the checkpoint's options
rebuild the tagger task, and so its vocabularies, from the tagger's own training data, and the
weights are loaded into the model it builds), tags the dev and test sentences once each in
batches (:meth:`~batchfold.training.ud.UDTask.predict` with
:func:`~batchfold.models.tagger.predict_tags`) and gives them back with each word's UPOS
replaced by the prediction, together with the tagger's accuracy on them. Training sentences
keep their gold tags, as usual.

Every way the file can fail to be a usable tagger is a :class:`~batchfold.errors.ConfigError`
that names the file and says what was expected.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import os
from pathlib import Path

from batchfold.cli import checkpoint_arguments
from batchfold.data.vocab import LabelSet
from batchfold.errors import CheckpointError, ConfigError
from batchfold.models.tagger import BiLSTMTagger, predict_tags
from batchfold.schedule import Scheduler
from batchfold.training import tagger
from batchfold.training.checkpoint import load_checkpoint
from batchfold.training.ud import UDSplits, add_option, expect_model

__all__ = ["PredictedTags", "add_predicted_tags_argument", "load_tagger", "predict_splits"]

EXPECTED = "expected a checkpoint written by 'batchfold train tagger' (best.pt in its --out folder)"
"""What ``--predicted-tags`` must name, as error messages say it."""


@dataclasses.dataclass(frozen=True)
class PredictedTags:
    """The splits a parser sees with predicted tags, and how good those tags are.

    Arguments:
        path: the tagger checkpoint.
        splits: training sentences with gold tags, dev and test sentences with predicted ones.
        accuracy: the tagger's UPOS accuracy in percent on the replaced sentences, by split
            (``{"dev": ..., "test": ...}``).
        unknown_tags: tags the tagger can predict that the parser never saw in training (it
            reads them as an unseen tag).
    """

    path: str
    splits: UDSplits
    accuracy: dict[str, float]
    unknown_tags: tuple[str, ...]


def add_predicted_tags_argument(parser: argparse.ArgumentParser) -> None:
    """The ``--predicted-tags PATH`` option (default: gold tags).

    Arguments:
        parser: the command line parser to extend.
    """
    add_option(
        parser,
        "--predicted-tags",
        default=None,
        metavar="PATH",
        help="evaluate on dev and test with UPOS tags predicted by this tagger checkpoint (a "
        "best.pt of 'batchfold train tagger'); training keeps gold tags (default: gold tags)",
    )


def _error(path: str | os.PathLike[str], problem: str) -> ConfigError:
    return ConfigError(f"--predicted-tags {path}: {problem}; {EXPECTED}")


def load_tagger(
    path: str | os.PathLike[str],
    device: str = "cpu",
    eval_batch: int = 512,
    scheduler: Scheduler = "agenda",
) -> tuple[tagger.TaggerTask, BiLSTMTagger]:
    """The tagger task and trained model of a ``batchfold train tagger`` checkpoint.

    As ``batchfold eval tagger --checkpoint PATH``: the checkpoint's options rebuild the task
    (reading the tagger's training data for its vocabularies) and its weights are loaded into
    the model the task builds. The task's dev and test splits are left empty.

    Arguments:
        path: the checkpoint.
        device: where the model goes.
        eval_batch: sentences per ``batch_map`` call when the task predicts.
        scheduler: ``batch_map``'s scheduler.

    Returns:
        ``(task, model)``, the model in eval mode.

    Raises:
        ConfigError: no such file, not a readable checkpoint, not a tagger's, or weights that
            do not fit the vocabularies rebuilt from the tagger's training data.
    """
    if not Path(path).is_file():
        raise _error(path, "a folder, not a file" if Path(path).is_dir() else "no such file")
    try:
        state = load_checkpoint(path, device, advice=EXPECTED)
    except CheckpointError as err:  # its message names the file and says what was expected
        raise ConfigError(f"--predicted-tags {path}: {err}") from err
    config = state["config"]
    task_name = config.get("task") if isinstance(config, dict) else None
    if task_name != "tagger":
        raise _error(path, f"this is a checkpoint of the {task_name or 'unknown'} task")
    options = ["--checkpoint", os.fspath(path), "--device", device, "--scheduler", scheduler]
    args = checkpoint_arguments(
        "tagger", config, [*options, "--eval-batch-size", str(eval_batch), "--max-eval", "1"]
    )
    args.glove = None  # the checkpoint holds the word vectors
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # its summary line would mislead here
            task = tagger.make_task(args)
    except (OSError, ValueError) as err:
        raise _error(
            path, f"cannot rebuild its vocabularies from its training data: {err}"
        ) from err
    model: BiLSTMTagger = expect_model(task.build_model(), BiLSTMTagger).to(device)
    try:
        model.load_state_dict(state["model"])
    except (RuntimeError, KeyError, TypeError) as err:
        first = (str(err).strip().splitlines() or [""])[0]
        raise _error(
            path,
            f"its weights do not fit the word, character and tag vocabularies rebuilt from its "
            f"training data (--data {args.data}, --max-train {args.max_train}); has that data "
            f"changed since it was trained? ({type(err).__name__}: {first})",
        ) from err
    return task, model.eval()


def predict_splits(
    path: str | os.PathLike[str],
    splits: UDSplits,
    parser_tags: LabelSet,
    *,
    device: str = "cpu",
    eval_batch: int = 512,
    scheduler: Scheduler = "agenda",
) -> PredictedTags:
    """``splits`` with the UPOS tags of dev and test predicted by a tagger checkpoint.

    Arguments:
        path: the tagger checkpoint (see :func:`load_tagger`).
        splits: the parser's sentences; ``train`` is kept as it is.
        parser_tags: the parser's tag set, built from its training sentences.
        device: where the tagger runs.
        eval_batch: sentences per ``batch_map`` call.
        scheduler: ``batch_map``'s scheduler.

    Returns:
        The new splits, the tagger's accuracy on dev and test, and the tags it can predict
        that the parser does not know.

    Raises:
        ConfigError: the checkpoint cannot be loaded (see :func:`load_tagger`), or its tag set
            shares no tag with the parser's.
    """
    task, model = load_tagger(path, device, eval_batch, scheduler)
    tags = model.vocabs.upos
    unknown = tuple(t for t in tags.labels if t not in parser_tags)
    if len(unknown) == len(tags.labels):
        raise _error(
            path,
            f"its tags ({', '.join(tags.labels)}) share none with the parser's training tags "
            f"({', '.join(parser_tags.labels)})",
        )
    task.splits = UDSplits(task.splits.train, splits.dev, splits.test)
    replaced, accuracy = {}, {}
    for split in ("dev", "test"):
        sentences, predicted = task.predict(model, predict_tags, split)
        accuracy[split] = tagger.upos_accuracy(tags, sentences, predicted)
        replaced[split] = [
            dataclasses.replace(s, upos=tuple(tags.decode(ids)))
            for s, ids in zip(sentences, predicted, strict=True)
        ]
    return PredictedTags(
        path=os.fspath(path),
        splits=UDSplits(splits.train, replaced["dev"], replaced["test"]),
        accuracy=accuracy,
        unknown_tags=unknown,
    )
