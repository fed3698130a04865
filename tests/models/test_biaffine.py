"""The biaffine parser: batched equals one sentence at a time; the task learns tiny trees."""

from __future__ import annotations

import random
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from test_parser import NONPROJECTIVE, assert_defaults_are_the_run, random_sentences, sentence
from treebank_files import write_treebank

import batchfold as bf
from batchfold.cli import build_parser
from batchfold.data.conllu import Sentence
from batchfold.data.ud import build_vocabs
from batchfold.models.biaffine import BiaffineParser, decode, gold_columns, parse, sentence_loss
from batchfold.training.biaffine import BiaffineTask, make_task
from reference import assert_matches_eager

pytestmark = pytest.mark.usefixtures("float64")


def tiny_biaffine(sentences: list[Sentence], pos_dim: int = 2, dropout: float = 0.0):
    torch.manual_seed(0)
    model = BiaffineParser(
        build_vocabs(sentences),
        word_dim=3,
        pos_dim=pos_dim,
        hidden=4,
        layers=2,
        arc_dim=5,
        label_dim=3,
        dropout=dropout,
    )
    for p in model.parameters():  # larger than the default (U starts at 0): scores differ
        torch.nn.init.uniform_(p, -1.0, 1.0)
    return model


def mixed_sentences(seed: int) -> list[Sentence]:
    """Random trees of 1-9 words, a non-projective one and a one-word sentence."""
    rng = random.Random(seed)
    return random_sentences(9, rng, max_len=9) + [sentence(NONPROJECTIVE, rng), sentence([0], rng)]


@pytest.mark.parametrize("pos_dim", [2, 0])
@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_batched_losses_and_gradients_equal_per_sentence(pos_dim: int, scheduler) -> None:
    sentences = mixed_sentences(pos_dim)
    model = tiny_biaffine(sentences, pos_dim)
    stats = assert_matches_eager(
        partial(sentence_loss, model), sentences, module=model, scheduler=scheduler
    )
    assert stats.syncs == 0 and stats.ragged_steps > 0
    # the losses over rows of n + 1 heads batch by a rule (sentences of equal length)
    assert not [name for name in stats.fallbacks if name.startswith("cross_entropy")]


def test_the_loss_is_the_cross_entropy_of_every_gold_head_and_relation() -> None:
    sentences = mixed_sentences(1)
    model = tiny_biaffine(sentences)
    for s in sentences:
        states = model.encode(s)
        scores, n = model.arc_scores(states), len(s)
        heads = torch.tensor(gold_columns(s))
        labels = torch.tensor([model.vocabs.deprels.index(r) for r in s.deprels])
        # relation scores at the gold heads: the bilinear form of Dozat and Manning
        dep = torch.relu(model.label_dep(states[:n]))
        head = torch.relu(model.label_head(states))[heads]
        weight = model.label_weight.unflatten(1, (-1, dep.shape[1])).permute(1, 0, 2)
        rel = F.bilinear(dep, head, weight) + model.label_linear(torch.cat([dep, head], -1))
        want = F.cross_entropy(scores[:n], heads, reduction="sum")
        want = want + F.cross_entropy(rel, labels, reduction="sum")
        torch.testing.assert_close(sentence_loss(model, s), want)
        assert scores.shape == (n + 1, n + 1)


def test_batched_parsing_equals_eager_without_reads() -> None:
    sentences = mixed_sentences(3)
    model = tiny_biaffine(sentences)
    model.eval()
    with torch.no_grad():
        eager = [decode(model, *parse(model, s)) for s in sentences]
        batched, stats = bf.batch_map(partial(parse, model), sentences, return_stats=True)
    assert [decode(model, *p) for p in batched] == eager
    assert stats.syncs == 0
    for (heads, labels), s in zip(eager, sentences, strict=True):
        assert len(heads) == len(labels) == len(s)
        assert all(0 <= h <= len(s) for h in heads) and all(labels)
    assert len({tuple(h) for h, _ in eager}) > 1  # the parses differ between sentences


def test_dropout_draws_in_training_only() -> None:
    sentences = mixed_sentences(4)
    model = tiny_biaffine(sentences, dropout=0.5)
    s = max(sentences, key=len)
    assert not torch.equal(sentence_loss(model, s), sentence_loss(model, s))
    model.eval()
    torch.testing.assert_close(sentence_loss(model, s), sentence_loss(model, s))
    with pytest.raises(ValueError, match=r"expected dropout in \[0, 1\), found 1.0"):
        BiaffineParser(build_vocabs(sentences), dropout=1.0)


def tiny_task(folder: Path, *options: str) -> BiaffineTask:
    rng = random.Random(8)
    train = random_sentences(5, rng, max_len=6) + [sentence(NONPROJECTIVE, rng, 9)]
    write_treebank(folder, train, train, train)
    args = build_parser("train", "biaffine").parse_args(
        ["--data", str(folder), "--word-dim", "6", "--pos-dim", "3", "--hidden", "10"]
        + ["--arc-dim", "12", "--label-dim", "6", "--dropout", "0", "--word-dropout", "0"]
        + ["--eval-batch", "2", "--glove", "none", "--tag-dropout", "0", *options]
    )
    return make_task(args)


def test_task_trains_on_every_sentence_and_learns_the_training_trees(
    tmp_path: Path, capsys
) -> None:
    task = tiny_task(tmp_path)
    assert "biaffine: 6 train, 6 dev, 6 test sentences" in capsys.readouterr().out
    assert (task.name, task.best_metric, task.unit) == ("biaffine", "dev_uas", "sentences")
    assert len(task.train_items()) == 6  # the non-projective sentence too
    model = task.build_model()
    before = task.evaluate(model, "dev")
    optimizer = torch.optim.Adam(task.param_groups(model, 0.05))
    losses = []
    for _ in range(40):
        optimizer.zero_grad()
        loss, terms = task.loss(model, task.train_items())
        (loss / terms).backward()
        optimizer.step()
        losses.append(loss.item() / terms)
    after = task.evaluate(model, "dev")
    assert losses[-1] < losses[0] / 4
    assert after["dev_uas"] >= 90 and after["dev_las"] >= 80 > before["dev_las"]
    batched, eager = (
        task.loss(model, task.train_items()),
        task.eager_loss(model, task.train_items()),
    )
    torch.testing.assert_close(batched[0], eager[0])
    assert batched[1] == eager[1] == 2 * sum(len(s) for s in task.train_items())


def test_the_defaults_are_the_settings_of_the_committed_runs() -> None:
    """``batchfold train biaffine`` with no options trains results/biaffine-seed0's model."""
    assert_defaults_are_the_run("biaffine", "biaffine-seed0")
