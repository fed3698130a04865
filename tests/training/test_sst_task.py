from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import pytest
import torch
from sst_files import TinySST

import batchfold as bf
from batchfold.cli import build_parser, main
from batchfold.data.sst import parse_tree
from batchfold.data.trees import random_trees
from batchfold.data.vocab import Vocab
from batchfold.models.tree_lstm import TreeLSTMClassifier, tree_node_losses
from batchfold.schedule import Scheduler
from batchfold.training.sst import (
    METRICS,
    SSTTask,
    TreeRNNClassifier,
    binary_accuracy,
    make_task,
    sentiment_accuracies,
    to_binary_tree,
    tree_node_logits,
)
from batchfold.training.task import EagerBaseline, Task
from reference import assert_matches_eager


def tiny_task(tiny_sst: TinySST, *extra: str) -> SSTTask:
    argv = tiny_sst.train_argv(Path("unused"))[2:]  # the options after "train sst"
    return make_task(build_parser("train", "sst").parse_args([*argv, *extra]))


def grads(model: torch.nn.Module, loss: torch.Tensor) -> list[torch.Tensor]:
    params = list(model.parameters())
    found = torch.autograd.grad(loss, params, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, found, strict=True)]


# -- metrics ----------------------------------------------------------------------------------


def test_binary_accuracy_compares_positive_and_negative_mass() -> None:
    probs = torch.tensor(
        [
            [0.05, 0.05, 0.80, 0.05, 0.05],  # tie 0.1 = 0.1: negative
            [0.40, 0.00, 0.00, 0.30, 0.30],  # argmax negative, but positive mass 0.6 wins
            [0.00, 0.35, 0.30, 0.35, 0.00],  # tie: negative
            [0.10, 0.10, 0.10, 0.60, 0.10],  # positive
            [0.20, 0.20, 0.20, 0.20, 0.20],  # gold neutral: not counted
        ]
    )
    labels = torch.tensor([1, 4, 0, 1, 2])
    # right: row 0 (negative, gold 1), row 1 (positive, gold 4), row 2 (negative, gold 0);
    # wrong: row 3 (positive, gold 1)
    assert binary_accuracy(probs, labels) == 75.0
    assert math.isnan(binary_accuracy(probs[4:], labels[4:]))


def test_binary_accuracy_checks_shapes() -> None:
    with pytest.raises(ValueError, match=r"expects probs \[n, 5\] and labels \[n\], got \[3, 4\]"):
        binary_accuracy(torch.zeros(3, 4), torch.zeros(3, dtype=torch.long))


def test_sentiment_accuracies_by_hand() -> None:
    probs = torch.tensor(
        [
            [0.0, 0.1, 0.1, 0.7, 0.1],  # root, gold 4: fine wrong, binary right
            [0.6, 0.1, 0.1, 0.1, 0.1],  # gold 0: fine right, binary right
            [0.1, 0.1, 0.6, 0.1, 0.1],  # gold 2: fine right, not in binary
            [0.1, 0.6, 0.1, 0.1, 0.1],  # root, gold 1: fine right, binary right
            [0.1, 0.1, 0.1, 0.1, 0.6],  # gold 0: fine wrong, binary wrong
        ]
    )
    labels = torch.tensor([4, 0, 2, 1, 0])
    is_root = torch.tensor([True, False, False, True, False])
    acc = sentiment_accuracies(probs, labels, is_root)
    assert list(acc) == list(METRICS)
    assert acc == {"root_fine": 50.0, "root_binary": 100.0, "all_fine": 60.0, "all_binary": 75.0}


# -- trees and per-instance code --------------------------------------------------------------


def test_to_binary_tree_keeps_labels_and_maps_words() -> None:
    tree = to_binary_tree(parse_tree("(1 (3 (2 Good) (4 zebra)) (0 bad))"), Vocab(["Good", "bad"]))
    assert [(n.word, n.label) for n in tree.nodes()] == [
        (1, 2),
        (0, 4),  # unknown word: id 0
        (None, 3),
        (2, 0),
        (None, 1),
    ]


def test_to_binary_tree_rejects_unary_nodes() -> None:
    with pytest.raises(ValueError, match=r"train.txt line 7: the node \(3 \(2 a\)\) has 1 child"):
        to_binary_tree(parse_tree("(2 (3 (2 a)) (2 b))"), Vocab(["a"]), "train.txt line 7")


@pytest.mark.parametrize("cell", ["treelstm", "treernn"])
@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_batched_logits_match_one_tree_at_a_time(
    float64: None, cell: str, scheduler: Scheduler
) -> None:
    kind = TreeLSTMClassifier if cell == "treelstm" else TreeRNNClassifier
    model = kind(50, emb_dim=6, hidden=5)
    for p in model.parameters():  # larger weights than the default, to exercise the gates
        torch.nn.init.uniform_(p, -1.0, 1.0)
    leaf = bf.function(model.cell.leaf, batched=True)
    node = bf.function(model.cell, batched=True)
    trees = random_trees(12, 1, 15, rng=3, vocab_size=50, n_classes=5)
    assert_matches_eager(
        lambda t: tree_node_logits(model, t, leaf, node), trees, model, scheduler=scheduler
    )


@pytest.mark.parametrize("front_end", ["lazy", "blocks"])
def test_loss_is_the_sum_of_tree_node_losses(tiny_sst: TinySST, front_end: str) -> None:
    task = tiny_task(tiny_sst, "--front-end", front_end)
    model = task.build_model().double().eval()
    assert isinstance(model, TreeLSTMClassifier)
    batch = task.train_items()[:6]
    ours, _ = task.loss(model, batch)
    reference = torch.stack([loss for t in batch for loss in tree_node_losses(model, t)]).sum()
    torch.testing.assert_close(ours, reference, rtol=1e-12, atol=1e-12)
    for g, w in zip(grads(model, ours), grads(model, reference), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


# -- the task ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cell", "front_end"), [("treelstm", "lazy"), ("treernn", "lazy"), ("treelstm", "blocks")]
)
def test_task_loss_batched_equals_eager(tiny_sst: TinySST, cell: str, front_end: str) -> None:
    task = tiny_task(tiny_sst, "--cell", cell, "--front-end", front_end)
    model = task.build_model().double().eval()  # no dropout: the two runs must agree
    batch = task.train_items()[:6]
    loss, terms = task.loss(model, batch)
    eager, eager_terms = task.eager_loss(model, batch)
    assert terms == eager_terms == sum(t.size for t in batch)
    torch.testing.assert_close(loss, eager, rtol=1e-12, atol=1e-12)
    for g, w in zip(grads(model, loss), grads(model, eager), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def test_dropout_is_active_in_train_mode_only(tiny_sst: TinySST) -> None:
    task = tiny_task(tiny_sst, "--dropout", "0.5")
    model = task.build_model()
    batch = task.train_items()[:8]
    model.train()
    first, second = task.loss(model, batch)[0], task.loss(model, batch)[0]
    assert not torch.equal(first, second)
    model.eval()
    with torch.no_grad():
        assert torch.equal(task.loss(model, batch)[0], task.loss(model, batch)[0])
        no_dropout = task.eager_loss(model, batch)[0]
    torch.testing.assert_close(task.loss(model, batch)[0].detach(), no_dropout)


@pytest.mark.parametrize("front_end", ["lazy", "blocks"])
def test_evaluate_matches_one_tree_at_a_time(tiny_sst: TinySST, front_end: str) -> None:
    task = tiny_task(tiny_sst, "--front-end", front_end)
    model = task.build_model().eval()
    with torch.no_grad():
        got = task.evaluate(model, "test")
        probs = [torch.stack(tree_node_logits(model, t)).softmax(-1) for t in task.trees["test"]]
    labels = [torch.tensor([n.label for n in t.nodes()]) for t in task.trees["test"]]
    root_probs = torch.stack([p[-1] for p in probs])
    root_labels = torch.stack([y[-1] for y in labels])
    all_probs, all_labels = torch.cat(probs), torch.cat(labels)
    want = {
        "root_fine": 100 * (root_probs.argmax(-1) == root_labels).double().mean().item(),
        "root_binary": binary_accuracy(root_probs, root_labels),
        "all_fine": 100 * (all_probs.argmax(-1) == all_labels).double().mean().item(),
        "all_binary": binary_accuracy(all_probs, all_labels),
    }
    assert got.keys() == want.keys()
    for name in METRICS:
        assert got[name] == pytest.approx(want[name], nan_ok=True)


def test_the_task_fits_the_loop(tiny_sst: TinySST) -> None:
    task: Task = tiny_task(tiny_sst)  # pyright checks the protocol here
    assert isinstance(task, EagerBaseline)
    assert (task.name, task.best_metric, task.unit) == ("sst", "root_fine", "trees")
    assert len(task.train_items()) == 16


def test_word_vectors_and_their_learning_rate(
    tiny_sst: TinySST, capsys: pytest.CaptureFixture[str]
) -> None:
    task = tiny_task(tiny_sst, "--embed-lr-scale", "0.25")
    assert "glove 4d: vectors for" in capsys.readouterr().out
    model = task.build_model()
    assert isinstance(model, TreeLSTMClassifier)
    good = task.vocab.lookup("good")
    glove_line = tiny_sst.glove.read_text().splitlines()[0].split()
    assert glove_line[0] == "good"
    torch.testing.assert_close(
        model.embedding.weight[good], torch.tensor([float(v) for v in glove_line[1:]])
    )
    embedding_group, rest_group = task.param_groups(model, lr=0.2)
    assert embedding_group["lr"] == pytest.approx(0.05) and rest_group["lr"] == 0.2
    assert embedding_group["params"] == [model.embedding.weight]
    assert len(rest_group["params"]) == len(list(model.parameters())) - 1
    # --weight-decay regularises every weight but the word vectors, as Tai et al.
    assert embedding_group["weight_decay"] == 0.0 and "weight_decay" not in rest_group


def test_random_word_vectors_without_glove(tiny_sst: TinySST) -> None:
    task = tiny_task(tiny_sst, "--glove", "none", "--word-dim", "3")
    weight = task.build_model().get_parameter("embedding.weight")
    assert weight.shape == (len(task.vocab), 3)
    assert float(weight.detach().abs().max()) <= 0.05


def test_blocks_front_end_needs_the_tree_lstm(tiny_sst: TinySST) -> None:
    # refused when the task is made, before a run touches its folder (it was at the first batch)
    with pytest.raises(ValueError, match="--front-end blocks runs the Tree-LSTM only"):
        tiny_task(tiny_sst, "--cell", "treernn", "--front-end", "blocks")


def test_recurrent_dropout_is_active_in_train_mode_only(tiny_sst: TinySST) -> None:
    task = tiny_task(tiny_sst, "--dropout", "0", "--recurrent-dropout", "0.5")
    model = task.build_model()
    assert isinstance(model.cell.candidate_dropout, torch.nn.Dropout)
    batch = task.train_items()[:8]
    model.train()
    assert not torch.equal(task.loss(model, batch)[0], task.loss(model, batch)[0])
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(task.loss(model, batch)[0], task.eager_loss(model, batch)[0])


def test_recurrent_dropout_needs_the_tree_lstm(tiny_sst: TinySST) -> None:
    task = tiny_task(tiny_sst, "--cell", "treernn", "--recurrent-dropout", "0.1")
    with pytest.raises(ValueError, match="Tree-LSTM cell only"):
        task.build_model()


def test_glove_dim_100_reads_the_partial_file(
    tiny_sst: TinySST, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A fake 100d file with vectors for three of the tiny data set's words, named as in the
    # glove-sst data folder; every other word gets the usual uniform initialisation.
    folder = tmp_path / "glove-100"
    folder.mkdir()
    covered = {"good": 0.5, "movie": -0.25, "(": 1.5}  # "(" stands for -LRB-
    with gzip.open(folder / "glove.6B.100d.sst-partial.txt.gz", "wt", encoding="utf-8") as f:
        f.writelines(" ".join([w, *[str(v)] * 100]) + "\n" for w, v in covered.items())
    task = tiny_task(tiny_sst, "--glove", str(folder), "--glove-dim", "100")
    words = len(task.vocab) - 1
    found = sum(task.vocab.lookup(w) != 0 for w in ("good", "movie", "-LRB-"))
    assert task.args.word_dim == 100
    assert task.args.glove_words == {"dim": 100, "found": found, "missing": words - found}
    out = capsys.readouterr().out
    assert f"glove 100d: vectors for {found} of {words} words" in out
    assert f"{words - found} words without one get the usual random initialisation" in out
    weight = task.build_model().get_parameter("embedding.weight").detach()
    assert weight.shape == (len(task.vocab), 100)
    for word, value in (("good", 0.5), ("movie", -0.25), ("-LRB-", 1.5)):
        if task.vocab.lookup(word) != 0:
            assert torch.equal(weight[task.vocab.lookup(word)], torch.full((100,), value))
    missing = [i for i, w in enumerate(task.vocab.words) if w not in ("good", "movie", "-LRB-")]
    assert float(weight[missing].abs().max()) <= 0.05


def test_glove_words_go_into_the_run_config(tiny_sst: TinySST, tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert main([*tiny_sst.train_argv(out), "--epochs", "1"]) == 0
    config = json.loads((out / "config.json").read_text())
    words = len(tiny_task(tiny_sst).vocab) - 1
    assert config["word_dim"] == 4 and config["glove_words"]["dim"] == 4
    assert config["glove_words"]["found"] + config["glove_words"]["missing"] == words


def test_recurrent_dropout_default_depends_on_the_cell(tiny_sst: TinySST) -> None:
    assert tiny_task(tiny_sst).args.recurrent_dropout == 0.1
    treernn = tiny_task(tiny_sst, "--cell", "treernn")
    assert treernn.args.recurrent_dropout == 0.0
    assert isinstance(treernn.build_model(), TreeRNNClassifier)
