"""The BiLSTM tagger: batched losses and predictions equal the one-sentence-at-a-time run."""

from __future__ import annotations

import json
import random
from functools import partial
from pathlib import Path

import pytest
import torch
from treebank_files import write_treebank

import batchfold as bf
from batchfold.cli import build_parser
from batchfold.data.conllu import Sentence
from batchfold.data.ud import build_vocabs
from batchfold.models.tagger import BiLSTM, BiLSTMTagger, predict_tags, sentence_losses
from batchfold.training.arguments import DEFAULT_LR
from batchfold.training.tagger import TaggerTask, UDSplits, make_task
from reference import assert_matches_eager

pytestmark = pytest.mark.usefixtures("float64")

WORDS = ["the", "dog", "ran", "home", "a", "cat", "sat", ".", "Mr.", "it's", "x"]
TAGS = ["DET", "NOUN", "VERB", "ADV", "PUNCT", "PRON"]


def random_sentences(count: int, rng: random.Random, max_len: int = 7) -> list[Sentence]:
    """Sentences of random words and tags on a chain tree (the tagger ignores the tree)."""
    sentences = []
    for k in range(count):
        n = rng.randint(1, max_len)
        sentences.append(
            Sentence(
                tuple(rng.choice(WORDS) for _ in range(n)),
                tuple(rng.choice(TAGS) for _ in range(n)),
                (0, *range(1, n)),
                ("root",) + ("dep",) * (n - 1),
                f"s{k}",
            )
        )
    return sentences


def tiny_tagger(sentences: list[Sentence], char_dim: int = 3, layers: int = 1) -> BiLSTMTagger:
    torch.manual_seed(0)
    model = BiLSTMTagger(
        build_vocabs(sentences), word_dim=4, char_dim=char_dim, hidden=5, layers=layers
    )
    for p in model.parameters():  # larger than the default, so that the gates do something
        torch.nn.init.uniform_(p, -0.8, 0.8)
    return model


@pytest.mark.parametrize(("char_dim", "layers"), [(3, 1), (0, 2)])
@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_batched_losses_equal_per_sentence_losses(char_dim: int, layers: int, scheduler) -> None:
    sentences = random_sentences(9, random.Random(char_dim + layers))
    model = tiny_tagger(sentences, char_dim, layers)
    stats = assert_matches_eager(
        partial(sentence_losses, model), sentences, module=model, scheduler=scheduler
    )
    longest = max(len(s) for s in sentences)
    # every sentence's forward steps run together: far fewer steps than nodes
    assert stats.steps < stats.nodes / 3
    assert stats.syncs == 0 and longest > 1


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_bilstm_steps_are_one_node_each_and_batch_across_sentences(scheduler) -> None:
    lstm = BiLSTM(2, 3, layers=2)
    _, stats = bf.batch_map(
        lambda seed: lstm([[torch.ones(2) * k] for k in range(3)]),
        range(4),
        scheduler=scheduler,
        return_stats=True,
    )
    # per sentence and position: a source, a mul, and 2 layers x 2 directions of LSTM steps;
    # the numbers k after the first seen (k = 1, 2) are read per instance: a source each
    assert stats.nodes == 4 * 3 * (2 + 4) + 4 * 2
    # a step per kind of source, a mul step for k = 0 and one for k = 1, 2 (one depth), one
    # step per layer, direction and position
    assert stats.steps == 2 + 2 + 2 * 2 * 3


def test_batched_predictions_equal_eager_and_read_once() -> None:
    sentences = random_sentences(12, random.Random(5))
    model = tiny_tagger(sentences)
    model.eval()
    eager = [predict_tags(model, s) for s in sentences]
    with torch.no_grad():
        batched, stats = bf.batch_map(partial(predict_tags, model), sentences, return_stats=True)
    assert batched == eager
    assert [len(tags) for tags in batched] == [len(s) for s in sentences]
    assert stats.syncs == 1  # every sentence reads its scores once, all in the same run


def test_word_dropout_only_in_training() -> None:
    sentences = random_sentences(4, random.Random(2))
    vocabs = build_vocabs(sentences)
    counts = [5] * len(vocabs.words)
    model = BiLSTMTagger(
        vocabs, word_dim=2, char_dim=0, hidden=2, word_counts=counts, word_dropout=1e9
    )
    assert all(model.word_id(w) == 0 for w in WORDS)  # alpha huge: always <unk>
    model.eval()
    assert [model.word_id(w) for w in ("dog", "zebra")] == [vocabs.words["dog"], 0]


def test_bad_sizes_are_reported() -> None:
    vocabs = build_vocabs(random_sentences(2, random.Random(0)))
    with pytest.raises(ValueError, match="expected char_dim of at least 0"):
        BiLSTMTagger(vocabs, char_dim=-1)
    with pytest.raises(ValueError, match="expected one word count per word id"):
        BiLSTMTagger(vocabs, word_counts=[1, 2])
    with pytest.raises(ValueError, match="expected at least 1 BiLSTM layer, found 0"):
        BiLSTM(2, 3, layers=0)


def test_unknown_gold_tag_is_a_clear_error() -> None:
    sentences = random_sentences(2, random.Random(0))
    model = tiny_tagger(sentences)
    odd = Sentence(("dog",), ("SYM",), (0,), ("root",))
    with pytest.raises(KeyError, match="found 'SYM'"):
        sentence_losses(model, odd)


def test_make_task_on_a_tiny_treebank_learns_the_training_tags(tmp_path: Path, capsys) -> None:
    train = random_sentences(6, random.Random(3))
    write_treebank(tmp_path, train, train[:4], train[:4])
    args = build_parser("train", "tagger").parse_args(
        ["--data", str(tmp_path), "--word-dim", "6", "--char-dim", "3", "--hidden", "8"]
        + ["--word-dropout", "0", "--max-eval", "3", "--scheduler", "depth", "--glove", "none"]
    )
    assert (args.optimizer, args.batch_size) == ("adam", 32)  # the task's defaults
    task = make_task(args)
    assert "tagger: 6 train, 3 dev, 3 test sentences" in capsys.readouterr().out
    assert (task.name, task.best_metric, task.unit) == ("tagger", "dev_upos", "sentences")
    assert task.scheduler == "depth"
    assert len(task.train_items()) == 6 and len(task.splits.dev) == 3
    model = task.build_model()
    optimizer = torch.optim.Adam(task.param_groups(model, 0.1))
    n_words = 0
    for _ in range(15):
        optimizer.zero_grad()
        loss, n_words = task.loss(model, task.train_items())
        (loss / n_words).backward()
        optimizer.step()
    assert n_words == sum(len(s) for s in train)
    assert model.training  # evaluate puts the mode back
    assert task.evaluate(model, "dev") == {"dev_upos": 100.0}
    assert set(task.evaluate(model, "test")) == {"test_upos"}
    batched, eager = task.loss(model, train), task.eager_loss(model, train)
    torch.testing.assert_close(batched[0], eager[0])
    assert batched[1] == eager[1] == n_words


def test_task_rejects_another_model_and_an_empty_training_set(tmp_path: Path) -> None:
    train = random_sentences(2, random.Random(1))
    task = TaggerTask(_splits(train), word_dim=2, char_dim=0, hidden=2)
    with pytest.raises(TypeError, match="expected a BiLSTMTagger"):
        task.loss(torch.nn.Linear(1, 1), train)
    with pytest.raises(ValueError, match="expected at least one training sentence"):
        TaggerTask(_splits([]))


def _splits(train: list[Sentence]) -> UDSplits:
    return UDSplits(train, train, train)


def test_a_sentence_of_no_words_gets_no_tags_in_a_batch_too() -> None:
    sentences = random_sentences(3, random.Random(4))
    model = tiny_tagger(sentences)
    empty = Sentence((), (), (), ())
    assert predict_tags(model, empty) == []  # a RuntimeError from torch.stack before
    got = bf.batch_map(lambda s: predict_tags(model, s), [sentences[0], empty, sentences[1]])
    assert got == [predict_tags(model, sentences[0]), [], predict_tags(model, sentences[1])]


def test_an_empty_dev_split_is_an_error_not_an_accuracy_of_0() -> None:
    """An empty dev file scored 0.00 and model selection went on as if it were a result."""
    train = random_sentences(2, random.Random(1))
    task = TaggerTask(UDSplits(train, [], train), word_dim=2, char_dim=0, hidden=2)
    model = task.build_model()
    with pytest.raises(ValueError, match="tagger dev: .* nothing to evaluate"):
        task.evaluate(model, "dev")
    assert 0 <= task.evaluate(model, "test")["test_upos"] <= 100


def test_glove_vectors_start_the_words_they_cover(tmp_path: Path, capsys) -> None:
    train = random_sentences(6, random.Random(3))
    glove = tmp_path / "glove.txt"
    glove.write_text("dog 1 2 3\nthe 4 5 6\nmr. 7 8 9\n")  # looked up lowercased
    task = TaggerTask(_splits(train), word_dim=3, char_dim=0, hidden=2, glove=str(glove), seed=1)
    words = task.vocabs.words
    present = [w for w in ("dog", "the", "Mr.") if w in words.words]
    assert "glove 3d: vectors for" in capsys.readouterr().out
    assert task.glove_words is not None and task.glove_words["found"] == len(present)
    model = task.build_model()
    assert isinstance(model, BiLSTMTagger)
    weight = model.word_embedding.weight
    expected = {"dog": [1.0, 2.0, 3.0], "the": [4.0, 5.0, 6.0], "Mr.": [7.0, 8.0, 9.0]}
    for word in present:
        assert weight[words.encode([word])[0]].tolist() == expected[word]
    missing = [i for i, w in enumerate(words.words) if w not in expected]
    assert weight[missing].abs().max() <= 0.05  # the usual small random start
    with pytest.raises(FileNotFoundError, match="--glove none for random vectors"):
        TaggerTask(_splits(train), word_dim=3, glove=str(tmp_path / "none.txt"))
    random_start = TaggerTask(_splits(train), word_dim=3, char_dim=0, hidden=2, glove="none")
    assert random_start.glove_words is None


def test_the_defaults_are_the_settings_of_the_committed_best_run() -> None:
    """``batchfold train tagger`` with no options trains results/tagger-glove150-l2's model."""
    committed = Path(__file__).resolve().parents[2] / "results/tagger-glove150-l2/config.json"
    config = json.loads(committed.read_text())
    args = vars(build_parser("train", "tagger").parse_args([]))
    # where it ran and how it reported; the rest is the model and its training
    for name in ("out", "threads", "progress", "glove_words", "task"):
        config.pop(name)
    assert args["lr"] is None and DEFAULT_LR[args["optimizer"]] == config.pop("lr")  # resolved
    assert {name: args[name] for name in config} == config
