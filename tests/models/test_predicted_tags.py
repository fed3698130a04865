"""``--predicted-tags``: the parser evaluated on tags predicted by a trained tagger."""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from treebank_files import write_treebank

import batchfold.training.biaffine as biaffine_task
import batchfold.training.parser as parser_task
from batchfold import cli
from batchfold.cli import build_parser
from batchfold.data.conllu import Sentence
from batchfold.data.ud import build_vocabs
from batchfold.errors import ConfigError
from batchfold.models.parser import parse, sentence_loss
from batchfold.models.tagger import BiLSTMTagger, predict_tags
from batchfold.training.checkpoint import load_checkpoint, save_checkpoint

WORDS = ["the", "dog", "ran", "home", "a", "cat", "sat", ".", "on", "it"]
TAGS = ["DET", "NOUN", "VERB", "ADV", "PUNCT", "ADP"]


def chain_sentences(count: int, rng: random.Random, first: int) -> list[Sentence]:
    """Random words with random tags on a chain tree (projective), ids from ``first``."""
    sentences = []
    for k in range(first, first + count):
        n = rng.randint(2, 6)
        sentences.append(
            Sentence(
                tuple(rng.choice(WORDS) for _ in range(n)),
                tuple(rng.choice(TAGS) for _ in range(n)),
                tuple(range(n)),
                ("root",) + ("dep",) * (n - 1),
                f"s{k}",
            )
        )
    return sentences


@dataclass
class TaggerRun:
    """A treebank on disk and a tagger trained on it for one epoch (an imperfect tagger)."""

    data: Path
    checkpoint: Path
    train: list[Sentence]
    dev: list[Sentence]
    test: list[Sentence]


@pytest.fixture(scope="module")
def tagger_run(tmp_path_factory: pytest.TempPathFactory) -> TaggerRun:
    root = tmp_path_factory.mktemp("predicted-tags")
    rng = random.Random(5)
    train, dev, test = (chain_sentences(n, rng, k) for n, k in ((8, 0), (4, 10), (3, 20)))
    while {t for s in train for t in s.upos} != set(TAGS):  # the parser knows every tag
        train.append(chain_sentences(1, rng, len(train))[0])
    write_treebank(root, train, dev, test)
    out = root / "tagger"
    argv = ["train", "tagger", "--data", str(root), "--word-dim", "4", "--char-dim", "2"]
    argv += ["--glove", "none", "--layers", "1"]
    argv += ["--hidden", "4", "--epochs", "1", "--compare-batches", "0", "--no-progress"]
    assert cli.main([*argv, "--out", str(out)]) == 0
    return TaggerRun(root, out / "best.pt", train, dev, test)


def direct_predictions(run: TaggerRun, sentences: list[Sentence]) -> dict[str, tuple[str, ...]]:
    """The tagger's tags by sentence id, from its weights, one sentence at a time."""
    state = load_checkpoint(run.checkpoint)
    config = state["config"]
    model = BiLSTMTagger(
        build_vocabs(run.train),
        word_dim=config["word_dim"],
        char_dim=config["char_dim"],
        hidden=config["hidden"],
        layers=config["layers"],
    )
    model.load_state_dict(state["model"])
    model.eval()
    with torch.no_grad():
        return {
            s.sent_id: tuple(model.vocabs.upos.decode(predict_tags(model, s))) for s in sentences
        }


def direct_accuracy(run: TaggerRun, sentences: list[Sentence]) -> float:
    predicted = direct_predictions(run, sentences)
    pairs = [(p, g) for s in sentences for p, g in zip(predicted[s.sent_id], s.upos, strict=True)]
    return 100.0 * sum(p == g for p, g in pairs) / len(pairs)


def parser_argv(run: TaggerRun, *options: str) -> list[str]:
    return [
        *("--data", str(run.data), "--word-dim", "4", "--pos-dim", "3", "--hidden", "4"),
        *("--mlp-hidden", "5", "--eval-batch-size", "2", "--glove", "none", "--tag-dropout", "0"),
        *("--lr-schedule", "constant", *options),  # resumed with more epochs below
    ]


def make_parser_task(run: TaggerRun, *options: str) -> parser_task.ParserTask:
    args = build_parser("train", "parser").parse_args(parser_argv(run, *options))
    return parser_task.make_task(args)


@pytest.mark.usefixtures("float64")
def test_parser_sees_predicted_tags_on_dev_and_test_and_gold_tags_in_training(
    tagger_run: TaggerRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = make_parser_task(tagger_run, "--predicted-tags", str(tagger_run.checkpoint))
    model = task.build_model()
    seen: list[Sentence] = []

    def spy_parse(m, s):
        seen.append(s)
        return parse(m, s)

    def spy_loss(m, s):
        seen.append(s)
        return sentence_loss(m, s)

    monkeypatch.setattr(parser_task, "parse", spy_parse)
    monkeypatch.setattr(parser_task, "sentence_loss", spy_loss)
    for split in ("dev", "test"):
        gold = getattr(tagger_run, split)
        want = direct_predictions(tagger_run, gold)
        assert any(want[s.sent_id] != s.upos for s in gold)  # else gold would pass as well
        seen.clear()
        task.evaluate(model, split)
        assert {s.sent_id: s.upos for s in seen} == want
        assert [s.words for s in task.splits.split(split)] == [s.words for s in gold]
    seen.clear()
    task.loss(model, task.train_items())
    assert {s.sent_id: s.upos for s in seen} == {s.sent_id: s.upos for s in tagger_run.train}


def test_train_records_the_tagger_accuracy_and_eval_and_resume_use_it(
    tagger_run: TaggerRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dev, test = (direct_accuracy(tagger_run, s) for s in (tagger_run.dev, tagger_run.test))
    assert dev < 100 and test < 100
    out = tmp_path / "parser"
    argv = ["train", "parser", *parser_argv(tagger_run, "--epochs", "1", "--compare-batches", "0")]
    argv += ["--no-progress", "--out", str(out), "--predicted-tags", str(tagger_run.checkpoint)]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert f"predicted by {tagger_run.checkpoint} (its accuracy on them: dev {dev:.2f}, " in printed
    assert f"test {test:.2f}); training uses gold tags" in printed
    config = json.loads((out / "config.json").read_text())
    assert config["predicted_tags"] == str(tagger_run.checkpoint)
    assert config["predicted_tags_upos"] == pytest.approx({"dev": dev, "test": test}, abs=1e-9)
    summary = json.loads((out / "test.json").read_text())
    assert summary["dev"]["dev_tagger_upos"] == pytest.approx(dev, abs=1e-9)
    assert summary["test"]["test_tagger_upos"] == pytest.approx(test, abs=1e-9)
    assert cli.main(["eval", "parser", "--checkpoint", str(out / "best.pt")]) == 0
    rows = dict(line.split() for line in capsys.readouterr().out.splitlines() if line[:2] == "  ")
    assert float(rows["tagger_upos"]) == pytest.approx(test, abs=0.005)
    assert float(rows["uas"]) == pytest.approx(summary["test"]["test_uas"], abs=0.005)
    assert cli.main([*argv, "--epochs", "2", "--resume"]) == 0


def test_runs_from_before_the_option_still_resume(
    tagger_run: TaggerRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "parser"
    argv = ["train", "parser", *parser_argv(tagger_run, "--compare-batches", "0", "--no-progress")]
    argv += ["--out", str(out)]
    assert cli.main([*argv, "--epochs", "1"]) == 0
    for name in ("last.pt", "best.pt"):  # as an earlier batchfold saved them
        state = load_checkpoint(out / name)
        for option in ("predicted_tags", "glove", "tag_dropout"):
            del state["config"][option]
        save_checkpoint(out / name, state)
    assert cli.main([*argv, "--epochs", "2", "--resume"]) == 0
    test = json.loads((out / "test.json").read_text())["test"]
    assert set(test) == {"test_uas", "test_las"}  # gold tags: no tagger accuracy
    # the options it lacks are read as what it ran with: random vectors, no tag dropout
    capsys.readouterr()
    assert cli.main([*argv, "--epochs", "3", "--resume", "--tag-dropout", "0.2"]) != 0
    assert "(tag_dropout: 0.0 -> 0.2)" in capsys.readouterr().err
    assert cli.main(["eval", "parser", "--checkpoint", str(out / "best.pt")]) == 0
    assert "glove" not in capsys.readouterr().out  # no GloVe file read for it


def _rewritten_tagger(run: TaggerRun, folder: Path, **config: object) -> Path:
    state = load_checkpoint(run.checkpoint)
    state["config"] = {**state["config"], **config}
    path = folder / "edited.pt"
    save_checkpoint(path, state)
    return path


@pytest.mark.parametrize(
    ("make_file", "problem"),
    [
        (lambda run, d: d / "missing.pt", "no such file"),
        (lambda run, d: d, "a folder, not a file"),
        (lambda run, d: run.data / "en_ewt-ud-dev.conllu", "is not a batchfold checkpoint"),
        (lambda run, d: _rewritten_tagger(run, d, task="parser"), "of the parser task"),
        (
            lambda run, d: _rewritten_tagger(run, d, max_train=2),
            r"its weights do not fit the word, character and tag vocabularies .* --max-train 2",
        ),
        (
            lambda run, d: _rewritten_tagger(run, d, data=str(d / "nowhere")),
            "cannot rebuild its vocabularies from its training data",
        ),
    ],
)
def test_a_file_that_is_no_usable_tagger_is_a_clear_error(
    tagger_run: TaggerRun, tmp_path: Path, make_file, problem: str, capsys
) -> None:
    path = make_file(tagger_run, tmp_path)
    expected = "expected a checkpoint written by 'batchfold train tagger'"
    start = re.escape(f"--predicted-tags {path}: ")
    with pytest.raises(ConfigError, match=rf"^{start}.*{problem}.*{expected}"):
        make_parser_task(tagger_run, "--predicted-tags", str(path))
    capsys.readouterr()
    argv = ["train", "parser", *parser_argv(tagger_run), "--predicted-tags", str(path)]
    assert cli.main([*argv, "--out", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"batchfold train parser: error: --predicted-tags {path}: ")
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("task", ["parser", "biaffine"])
def test_predicted_tags_need_a_parser_that_reads_tags(
    task: str, tagger_run: TaggerRun, tmp_path: Path
) -> None:
    """Refused before any data loads: the treebank folder here does not exist."""
    options = ["--data", str(tmp_path / "missing"), "--glove", "none", "--pos-dim", "0"]
    args = build_parser("train", task).parse_args(
        [*options, "--predicted-tags", str(tagger_run.checkpoint)]
    )
    module = biaffine_task if task == "biaffine" else parser_task
    with pytest.raises(ConfigError, match=r"the parser reads no tags \(--pos-dim 0\)"):
        module.make_task(args)


def test_the_biaffine_parser_trains_evaluates_and_resumes_on_predicted_tags(
    tagger_run: TaggerRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    test = direct_accuracy(tagger_run, tagger_run.test)
    out = tmp_path / "biaffine"
    argv = ["train", "biaffine", "--data", str(tagger_run.data), "--word-dim", "4"]
    argv += ["--pos-dim", "3", "--hidden", "4", "--arc-dim", "5", "--label-dim", "3"]
    argv += ["--eval-batch-size", "2", "--glove", "none", "--lr-schedule", "constant"]
    argv += ["--compare-batches", "1", "--no-progress", "--out", str(out)]
    argv += ["--predicted-tags", str(tagger_run.checkpoint)]
    assert cli.main([*argv, "--epochs", "1"]) == 0
    assert "training uses gold tags" in capsys.readouterr().out
    summary = json.loads((out / "test.json").read_text())
    assert summary["test"]["test_tagger_upos"] == pytest.approx(test, abs=1e-9)
    assert cli.main(["eval", "biaffine", "--checkpoint", str(out / "best.pt")]) == 0
    rows = dict(line.split() for line in capsys.readouterr().out.splitlines() if line[:2] == "  ")
    assert float(rows["uas"]) == pytest.approx(summary["test"]["test_uas"], abs=0.005)
    assert float(rows["las"]) == pytest.approx(summary["test"]["test_las"], abs=0.005)
    assert cli.main([*argv, "--epochs", "2", "--resume"]) == 0
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2
