"""The arc-hybrid parser: batched losses and greedy parses equal the one-sentence-at-a-time run."""

from __future__ import annotations

import json
import random
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from treebank_files import write_treebank

import batchfold as bf
from batchfold.cli import build_parser
from batchfold.data.conllu import Sentence
from batchfold.data.ud import build_vocabs
from batchfold.models.parser import (
    ArcHybridParser,
    best_transition,
    cheapest_actions,
    exploring_loss,
    parse,
    sentence_loss,
    transition_loss,
)
from batchfold.models.transitions import Action, ArcHybrid, oracle_transitions
from batchfold.training.arguments import DEFAULT_LR
from batchfold.training.parser import ParserTask, make_task
from batchfold.training.tagger import UDSplits
from reference import assert_matches_eager

pytestmark = pytest.mark.usefixtures("float64")

WORDS = ["the", "dog", "ran", "home", "a", "cat", "sat", ".", "on", "it"]
TAGS = ["DET", "NOUN", "VERB", "ADV", "PUNCT", "ADP"]
RELATIONS = ["nsubj", "obj", "det", "punct", "obl:tmod"]
NONPROJECTIVE = (3, 4, 0, 3)  # 1 <- 3 crosses 2 <- 4


def projective_heads(n: int, rng: random.Random) -> list[int]:
    """A random projective tree: each span's head splits it into two projective spans."""
    heads = [0] * n
    todo = [(1, n, 0)]  # words lo..hi hang from head
    while todo:
        lo, hi, head = todo.pop()
        if lo > hi:
            continue
        top = rng.randint(lo, hi)
        heads[top - 1] = head
        todo += [(lo, top - 1, top), (top + 1, hi, top)]
    return heads


def sentence(heads: list[int] | tuple[int, ...], rng: random.Random, k: int = 0) -> Sentence:
    n = len(heads)
    return Sentence(
        tuple(rng.choice(WORDS) for _ in range(n)),
        tuple(rng.choice(TAGS) for _ in range(n)),
        tuple(heads),
        tuple("root" if h == 0 else rng.choice(RELATIONS) for h in heads),
        f"s{k}",
    )


def random_sentences(count: int, rng: random.Random, max_len: int = 7) -> list[Sentence]:
    return [sentence(projective_heads(rng.randint(1, max_len), rng), rng, k) for k in range(count)]


def tiny_parser(sentences: list[Sentence], pos_dim: int = 2) -> ArcHybridParser:
    torch.manual_seed(0)
    model = ArcHybridParser(
        build_vocabs(sentences), word_dim=3, pos_dim=pos_dim, hidden=4, layers=2, mlp_hidden=5
    )
    for p in model.parameters():  # larger than the default, so that scores differ clearly
        torch.nn.init.uniform_(p, -1.0, 1.0)
    return model


@pytest.mark.parametrize("pos_dim", [2, 0])
@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_batched_losses_equal_per_sentence_losses(pos_dim: int, scheduler) -> None:
    sentences = random_sentences(8, random.Random(pos_dim))
    model = tiny_parser(sentences, pos_dim)
    stats = assert_matches_eager(
        partial(sentence_loss, model), sentences, module=model, scheduler=scheduler
    )
    assert stats.syncs == 0  # the static oracle reads nothing


def test_batched_greedy_parsing_equals_eager_with_one_sync_per_transition() -> None:
    rng = random.Random(7)
    sentences = random_sentences(10, rng, max_len=9) + [sentence(NONPROJECTIVE, rng)]
    model = tiny_parser(sentences)
    model.eval()
    eager = [parse(model, s) for s in sentences]
    with torch.no_grad():
        batched, stats = bf.batch_map(partial(parse, model), sentences, return_stats=True)
    assert batched == eager
    for (heads, labels), s in zip(batched, sentences, strict=True):
        assert len(heads) == len(labels) == len(s)
        assert all(0 <= h <= len(s) for h in heads) and all(labels)
    # a sentence of n words takes 2n transitions, each a read; all sentences read together
    assert stats.syncs == 2 * max(len(s) for s in sentences)
    assert len({tuple(h) for h, _ in eager}) > 1  # the parses differ between sentences


def test_exploring_loss_batched_equals_eager_values_and_gradients() -> None:
    sentences = random_sentences(6, random.Random(3))
    model = tiny_parser(sentences)

    def loss(s: Sentence) -> torch.Tensor:  # one random stream per sentence, as eagerly
        return exploring_loss(model, s, explore=0.5, rng=random.Random(s.sent_id))[0]

    stats = assert_matches_eager(loss, sentences, module=model)
    assert stats.syncs == 2 * max(len(s) for s in sentences)


def test_a_sentence_of_no_words_has_a_loss_of_0() -> None:
    """``torch.stack`` of no transition losses raised a RuntimeError before."""
    sentences = random_sentences(2, random.Random(5))
    model = tiny_parser(sentences)
    empty = Sentence((), (), (), ())
    assert sentence_loss(model, empty).item() == 0.0
    assert exploring_loss(model, empty, 0.5, random.Random(0))[1] == 0
    got = bf.batch_map(lambda s: sentence_loss(model, s), [sentences[0], empty])
    torch.testing.assert_close(got[0], sentence_loss(model, sentences[0]), rtol=0, atol=1e-6)
    assert got[1].item() == 0.0


def test_oracle_transitions_are_among_the_cheapest() -> None:
    rng = random.Random(11)
    for s in random_sentences(20, rng, max_len=10):
        config = ArcHybrid(len(s))
        for action, label in oracle_transitions(s):
            assert action in cheapest_actions(config, s.heads)
            config.apply(action, label)


def test_best_transition_is_legal_and_labelled() -> None:
    # layout for 2 relations: SHIFT, LEFT_ARC, RIGHT_ARC, left relations, right relations
    scores = [0.0, 5.0, 6.0, 1.0, 2.0, 4.0, 3.0]
    config = ArcHybrid(3)
    assert best_transition(scores, config, 2) == (Action.SHIFT, None)  # the only legal one
    config.apply(Action.SHIFT)
    assert best_transition(scores, config, 2) == (Action.LEFT_ARC, 1)
    config.apply(Action.SHIFT)
    assert best_transition(scores, config, 2) == (Action.RIGHT_ARC, 0)
    assert best_transition([9.0, *scores[1:]], config, 2) == (Action.SHIFT, None)
    with pytest.raises(ValueError, match="expected a configuration with a legal transition"):
        best_transition(scores, ArcHybrid(0), 2)


def test_transition_loss_is_the_two_cross_entropies() -> None:
    scores = torch.randn(3, 3 + 2 * 4)
    targets = torch.tensor([[0, -100], [1, 3], [2, 0]])
    want = [
        F.cross_entropy(scores[0, :3], targets[0, 0]),
        F.cross_entropy(scores[1, :3], targets[1, 0])
        + F.cross_entropy(scores[1, 3:7], targets[1, 1]),
        F.cross_entropy(scores[2, :3], targets[2, 0])
        + F.cross_entropy(scores[2, 7:], targets[2, 1]),
    ]
    torch.testing.assert_close(transition_loss(scores, targets), torch.stack(want))


def test_nonprojective_training_sentences_are_skipped_and_counted() -> None:
    rng = random.Random(4)
    train = random_sentences(5, rng) + [sentence(NONPROJECTIVE, rng, 9)]
    task = ParserTask(UDSplits(train, train[-1:], train), word_dim=2, pos_dim=0, hidden=2)
    assert task.skipped_nonprojective == 1
    assert list(task.train_items()) == train[:5]
    model = task.build_model()
    assert isinstance(model, ArcHybridParser)
    with pytest.raises(ValueError, match="expected a projective tree"):
        sentence_loss(model, train[-1])
    metrics = task.evaluate(model, "dev")  # dev is the non-projective sentence: 4 words
    assert set(metrics) == {"dev_uas", "dev_las"}
    assert metrics["dev_uas"] * 4 / 100 == round(metrics["dev_uas"] * 4 / 100)


def test_task_errors() -> None:
    train = [sentence(NONPROJECTIVE, random.Random(0))]
    with pytest.raises(ValueError, match="expected at least one projective training sentence"):
        ParserTask(UDSplits(train, train, train))
    ok = random_sentences(2, random.Random(0))
    with pytest.raises(ValueError, match="expected oracle 'static' or 'dynamic'"):
        ParserTask(UDSplits(ok, ok, ok), oracle="beam")
    with pytest.raises(ValueError, match=r"expected pos_dim of at least 0 \(0: no tags\)"):
        ArcHybridParser(build_vocabs(ok), pos_dim=-1)
    with pytest.raises(ValueError, match="expected mlp_hidden of at least 1, found 0"):
        ArcHybridParser(build_vocabs(ok), mlp_hidden=0)
    task = ParserTask(UDSplits(ok, ok, ok), word_dim=2, pos_dim=0, hidden=2)
    with pytest.raises(TypeError, match="expected a ArcHybridParser"):
        task.evaluate(torch.nn.Linear(1, 1), "dev")


def tiny_task(folder: Path, *options: str) -> ParserTask:
    rng = random.Random(8)
    train = random_sentences(5, rng, max_len=6) + [sentence(NONPROJECTIVE, rng, 9)]
    write_treebank(folder, train, train[:5], train)
    args = build_parser("train", "parser").parse_args(
        ["--data", str(folder), "--word-dim", "6", "--pos-dim", "3", "--hidden", "10"]
        + ["--mlp-hidden", "20", "--word-dropout", "0", "--eval-batch", "2", "--glove", "none"]
        + ["--tag-dropout", "0", *options]
    )
    return make_task(args)


def train_steps(task: ParserTask, model: torch.nn.Module, steps: int) -> list[float]:
    optimizer = torch.optim.Adam(task.param_groups(model, 0.05))
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss, n_transitions = task.loss(model, task.train_items())
        (loss / n_transitions).backward()
        optimizer.step()
        losses.append(loss.item() / n_transitions)
    return losses


def test_make_task_on_a_tiny_treebank_learns_the_training_trees(tmp_path: Path, capsys) -> None:
    task = tiny_task(tmp_path)
    out = capsys.readouterr().out
    assert "skipped 1 non-projective training sentences, training on 5" in out
    assert (task.name, task.best_metric, task.unit) == ("parser", "dev_uas", "sentences")
    assert task.skipped_nonprojective == 1 and len(task.train_items()) == 5
    model = task.build_model()
    before = task.evaluate(model, "dev")
    losses = train_steps(task, model, 30)
    after = task.evaluate(model, "dev")
    assert losses[-1] < losses[0] / 4
    assert after["dev_uas"] >= 90 and after["dev_las"] >= 80 > before["dev_las"]
    assert set(task.evaluate(model, "test")) == {"test_uas", "test_las"}
    batched, eager = (
        task.loss(model, task.train_items()),
        task.eager_loss(model, task.train_items()),
    )
    torch.testing.assert_close(batched[0], eager[0])
    assert batched[1] == eager[1] == 2 * sum(len(s) for s in task.train_items())


def test_dynamic_oracle_task_lowers_its_loss(tmp_path: Path) -> None:
    task = tiny_task(tmp_path, "--oracle", "dynamic", "--explore", "0.5")
    model = task.build_model()
    losses = train_steps(task, model, 12)
    assert losses[-1] < 0.7 * losses[0]


def test_glove_vectors_start_the_parsers_word_rows(tmp_path: Path, capsys) -> None:
    glove = tmp_path / "glove.txt"
    glove.write_text("dog 1 2 3\nthe 4 5 6\n")
    (tmp_path / "ud").mkdir()
    task = tiny_task(tmp_path / "ud", "--glove", str(glove), "--word-dim", "3")
    assert "glove 3d: vectors for" in capsys.readouterr().out
    model = task.build_model()
    assert isinstance(model, ArcHybridParser)
    words = model.vocabs.words
    assert task.glove_words is not None and task.glove_words["found"] == 2
    for word, vector in (("dog", [1.0, 2.0, 3.0]), ("the", [4.0, 5.0, 6.0])):
        got = model.word_embedding.weight[words.lookup(word)]
        torch.testing.assert_close(got, torch.tensor(vector, dtype=got.dtype))
    # the root token's extra row keeps its random start; the model trains as before
    assert model.word_embedding.weight.shape[0] == len(words) + 1
    losses = train_steps(task, model, 12)
    assert losses[-1] < 0.7 * losses[0]
    with pytest.raises(FileNotFoundError, match="--glove none for random vectors"):
        tiny_task(tmp_path / "ud", "--glove", str(tmp_path / "missing.txt"))


def test_tag_dropout_reads_the_unknown_tag_in_training_only() -> None:
    sentences = random_sentences(6, random.Random(3))
    model = ArcHybridParser(build_vocabs(sentences), word_dim=3, pos_dim=2, hidden=4, mlp_hidden=5)
    unknown = model.root_tag + 1
    dropping = ArcHybridParser(
        build_vocabs(sentences), word_dim=3, pos_dim=2, hidden=4, mlp_hidden=5, tag_dropout=0.5
    )
    random.seed(0)
    tags = [t for s in sentences for _, t in dropping.token_ids(s)[:-1]]
    assert 0.2 < tags.count(unknown) / len(tags) < 0.8
    assert unknown not in [t for s in sentences for _, t in model.token_ids(s)]
    dropping.eval()  # evaluation reads every tag
    assert [dropping.token_ids(s) for s in sentences] == [model.token_ids(s) for s in sentences]
    with pytest.raises(ValueError, match=r"expected tag_dropout in \[0, 1\), found 1.0"):
        ArcHybridParser(build_vocabs(sentences), tag_dropout=1.0)


def test_the_defaults_are_the_settings_of_the_committed_best_run() -> None:
    """``batchfold train parser`` with no options trains results/parser-glove-tagdrop-seed0's
    model (that run also named a tagger for dev and test: ``--predicted-tags``)."""
    assert_defaults_are_the_run("parser", "parser-glove-tagdrop-seed0")


def assert_defaults_are_the_run(task: str, run: str) -> None:
    """``batchfold train <task>`` with no options trains the committed ``results/<run>``
    (a run on predicted tags: which tagger scored it is not an option of the model)."""
    committed = Path(__file__).resolve().parents[2] / "results" / run
    config = json.loads((committed / "config.json").read_text())
    args = vars(build_parser("train", task).parse_args([]))
    # where it ran, how it reported and which tagger scored it; the rest is the model and
    # its training
    for name in ("out", "threads", "progress", "glove_words", "task"):
        config.pop(name)
    for name in ("predicted_tags", "predicted_tags_upos"):
        assert config.pop(name)
    if args["lr"] is None:  # resolved from the optimizer when the run started
        assert DEFAULT_LR[args["optimizer"]] == config.pop("lr")
    assert {name: args[name] for name in config} == config
