"""The Tree-LSTM as blocks computes what tree_node_losses computes through batch_map."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import batchfold as bf
from batchfold.blocks import compile
from batchfold.data.sst import Tree, parse_tree
from batchfold.data.trees import BinaryTree, chain, random_trees
from batchfold.data.vocab import Vocab
from batchfold.models.tree_lstm import TreeLSTMClassifier, per_tree_loss, tree_node_losses
from batchfold.models.tree_lstm_blocks import tree_lstm_blocks
from batchfold.schedule import Scheduler

pytestmark = pytest.mark.usefixtures("float64", "walks")  # every test: generated and closures


def classifier(seed: int = 0, vocab: int = 50) -> TreeLSTMClassifier:
    torch.manual_seed(seed)
    model = TreeLSTMClassifier(vocab, emb_dim=6, hidden=5, n_classes=5)
    for p in model.parameters():  # larger weights than the default, to exercise the gates
        torch.nn.init.uniform_(p, -1.0, 1.0)
    return model


def batch_map_loss(model: TreeLSTMClassifier, trees: list[BinaryTree]) -> torch.Tensor:
    leaf = bf.function(model.cell.leaf, batched=True)
    node = bf.function(model.cell, batched=True)
    losses = bf.batch_map(lambda t: tree_node_losses(model, t, leaf, node), trees)
    return torch.stack([loss for tree in losses for loss in tree]).sum()


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_same_loss_and_gradients_as_batch_map(scheduler: Scheduler):
    model = classifier()
    trees = random_trees(12, 1, 10, rng=1, vocab_size=50)
    blocks = compile(tree_lstm_blocks(model), scheduler=scheduler)
    logits, metrics = blocks(trees)
    loss = metrics["loss"].sum()
    want = batch_map_loss(model, trees)
    torch.testing.assert_close(loss, want, rtol=1e-12, atol=1e-12)
    params = list(model.parameters())
    got_grads = torch.autograd.grad(loss, params)
    want_grads = torch.autograd.grad(want, params)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
    roots = torch.tensor([t.label for t in trees])
    last = [losses[-1] for losses in (tree_node_losses(model, t) for t in trees)]
    torch.testing.assert_close(F.cross_entropy(logits, roots, reduction="none"), torch.stack(last))
    assert len(metrics["logits"]) == sum(t.size for t in trees)


def binary(tree: Tree, vocab: Vocab) -> BinaryTree:
    if tree.word is not None:
        return BinaryTree.leaf(vocab[tree.word], tree.label)
    left, right = tree.children
    return BinaryTree.node(binary(left, vocab), binary(right, vocab), tree.label)


def test_sst_trees_with_a_vocabulary():
    lines = ["(3 (2 It) (4 (2 's) (4 good)))", "(1 (1 bad) (2 .))", "(2 fine)"]
    trees = [parse_tree(line) for line in lines]
    vocab = Vocab(word for t in trees for word in t.words())
    model = classifier(seed=1, vocab=len(vocab))
    blocks = compile(tree_lstm_blocks(model, vocab.__getitem__))
    plan = blocks.schedule(trees)
    _, metrics = blocks.run(plan)
    want = batch_map_loss(model, [binary(t, vocab) for t in trees])
    torch.testing.assert_close(metrics["loss"].sum(), want, rtol=1e-12, atol=1e-12)
    labels = sorted(node.label for t in trees for node in t.nodes())
    assert sorted(plan.labels["logits"]) == labels
    with pytest.raises(ValueError, match="needs word_id"):
        compile(tree_lstm_blocks(model))(trees)


def test_a_1000_deep_tree():
    model = classifier(seed=2)
    tree = chain(1000, rng=3, vocab_size=50)
    _, metrics = compile(tree_lstm_blocks(model))([tree])
    torch.testing.assert_close(
        metrics["loss"].sum(), per_tree_loss(model, tree), rtol=1e-10, atol=1e-10
    )


def test_eval_reaches_the_dropout_and_a_copy_runs_on_its_own_weights():
    """The blocks called closures over the model: its dropout was no submodule of the
    compiled model (``eval()`` left it on), and a deepcopy ran on the original's weights."""
    import copy

    torch.manual_seed(0)
    model = TreeLSTMClassifier(50, emb_dim=6, hidden=5, n_classes=5, dropout=0.5)
    trees = random_trees(6, 1, 8, rng=2, vocab_size=50)
    blocks = compile(tree_lstm_blocks(model))
    blocks.eval()
    assert not model.dropout.training
    (_, first), (_, second) = blocks(trees), blocks(trees)
    assert torch.equal(first["loss"], second["loss"])
    eager = torch.stack([loss for t in trees for loss in tree_node_losses(model, t)])
    torch.testing.assert_close(first["loss"].sum(), eager.sum(), rtol=0, atol=1e-10)
    twin = copy.deepcopy(blocks)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)
    (_, moved), (_, kept) = blocks(trees), twin(trees)
    assert not torch.equal(moved["loss"], first["loss"])
    assert torch.equal(kept["loss"], first["loss"])
    kept["loss"].sum().backward()
    assert all(p.grad is not None for p in twin.parameters())
    assert all(p.grad is None for p in model.parameters())
