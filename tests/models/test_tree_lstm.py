from __future__ import annotations

import pytest
import torch

from batchfold.data.trees import BinaryTree, chain, complete_tree, random_trees
from batchfold.models.tree_lstm import (
    BinaryTreeLSTMCell,
    FoldBenchmarkCell,
    TreeLSTMClassifier,
    TreeRNNCell,
    TreeRNNClassifier,
    flatten_trees,
    level_batched_loss,
    naive_batch_loss,
    per_tree_loss,
)


def _model(seed: int = 0, vocab: int = 1000) -> TreeLSTMClassifier:
    torch.manual_seed(seed)
    model = TreeLSTMClassifier(vocab, emb_dim=7, hidden=5, n_classes=5).double()
    for p in model.parameters():  # larger weights than the default, to exercise the gates
        torch.nn.init.uniform_(p, -1.0, 1.0)
    return model


def _grads(model: torch.nn.Module, loss: torch.Tensor) -> list[torch.Tensor]:
    params = list(model.parameters())
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)]


def test_lstm_cell_batch_matches_single():
    torch.manual_seed(0)
    cell = BinaryTreeLSTMCell(6, 4).double()
    x = torch.randn(9, 6, dtype=torch.float64)
    h, c = cell.leaf(x)
    assert h.shape == c.shape == (9, 4)
    for k in range(9):
        hk, ck = cell.leaf(x[k])
        assert hk.shape == (4,)
        torch.testing.assert_close(hk, h[k], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(ck, c[k], rtol=1e-12, atol=1e-14)
    h_l, c_l, h_r, c_r = torch.randn(4, 9, 4, dtype=torch.float64)
    h2, c2 = cell(h_l, c_l, h_r, c_r)
    for k in range(9):
        hk, ck = cell(h_l[k], c_l[k], h_r[k], c_r[k])
        torch.testing.assert_close(hk, h2[k], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(ck, c2[k], rtol=1e-12, atol=1e-14)


def test_lstm_cell_equations():
    torch.manual_seed(1)
    cell = BinaryTreeLSTMCell(3, 2).double()
    h_l, c_l, h_r, c_r = torch.randn(4, 2, dtype=torch.float64)
    g = cell.node_gates.weight @ torch.cat([h_l, h_r]) + cell.node_gates.bias
    i, f_l, f_r, o, u = g.view(5, 2)
    c = torch.sigmoid(i) * torch.tanh(u) + torch.sigmoid(f_l) * c_l + torch.sigmoid(f_r) * c_r
    h = torch.sigmoid(o) * torch.tanh(c)
    h2, c2 = cell(h_l, c_l, h_r, c_r)
    torch.testing.assert_close((h2, c2), (h, c))
    x = torch.randn(3, dtype=torch.float64)
    i, o, u = (cell.leaf_gates.weight @ x + cell.leaf_gates.bias).view(3, 2)
    c = torch.sigmoid(i) * torch.tanh(u)
    torch.testing.assert_close(cell.leaf(x), (torch.sigmoid(o) * torch.tanh(c), c))


def test_tree_rnn_cell():
    torch.manual_seed(0)
    cell = TreeRNNCell(6, 4)
    x = torch.randn(3, 6)
    h = cell.leaf(x)
    assert h.shape == (3, 4)
    assert cell(h, h).shape == (3, 4)
    assert cell(h[0], h[1]).shape == (4,)
    torch.testing.assert_close(cell(h[0], h[1]), cell(h[:1], h[1:2])[0])
    assert bool((cell(h, h).abs() < 1).all())


def test_fold_benchmark_cell():
    torch.manual_seed(0)
    cell = FoldBenchmarkCell(20, 8)
    left = cell.leaf(torch.tensor([1, 2, 3]))
    right = cell.leaf(torch.tensor([4, 5, 6]))
    assert left.shape == (3, 8)
    y = cell(left, right)
    assert y.shape == (3, 8)
    torch.testing.assert_close(cell(left[1], right[1]), y[1])
    z = torch.relu(cell.hidden_layer(torch.cat([left, right], -1)))
    f_l, f_r, i, g = cell.gate_layer(z).chunk(4, -1)
    expected = (
        torch.sigmoid(f_l) * left + torch.sigmoid(f_r) * right + torch.sigmoid(i) * torch.tanh(g)
    )
    torch.testing.assert_close(y, expected)


def test_flatten_trees_levels():
    trees = [complete_tree(2, rng=0), BinaryTree.leaf(3, label=4), chain(4, rng=1)]
    flat = flatten_trees(trees)
    assert flat.n_nodes == 7 + 1 + 7
    assert flat.offsets == [0, 9, 12, 14, 15]  # 9 leaves; levels 1, 2, 3
    assert flat.words.tolist()[4] == 3
    assert flat.labels.tolist()[4] == 4
    assert flat.children.shape == (2 * 6,)
    # Every child sits on a lower level than its parent.
    parents = torch.arange(9, 15).repeat_interleave(2)
    assert bool((flat.children < parents).all())


@pytest.mark.parametrize(
    "trees",
    [
        random_trees(1, 5, 5, rng=0),  # a batch of one tree
        [BinaryTree.leaf(3, label=2)],  # a single leaf
        [BinaryTree.leaf(1), BinaryTree.leaf(2, label=4)],
        random_trees(8, 1, 12, rng=1),  # single-leaf trees included
        random_trees(20, 2, 60, rng=2),
        [chain(30, rng=3), complete_tree(4, rng=4), *random_trees(5, 1, 3, rng=5)],
    ],
)
def test_level_batched_matches_naive(trees: list[BinaryTree]):
    model = _model()
    naive = naive_batch_loss(model, trees)
    batched = level_batched_loss(model, trees)
    assert naive.dtype == torch.float64
    torch.testing.assert_close(batched, naive, rtol=1e-10, atol=0)
    for g_batched, g_naive in zip(_grads(model, batched), _grads(model, naive), strict=True):
        torch.testing.assert_close(g_batched, g_naive, rtol=1e-10, atol=1e-12)


def test_naive_sums_per_tree_losses():
    model = _model(seed=3)
    trees = random_trees(3, 1, 10, rng=6)
    total = sum(per_tree_loss(model, t).item() for t in trees)
    assert naive_batch_loss(model, trees).item() == pytest.approx(total, rel=1e-12)


def test_per_tree_loss_is_node_cross_entropy():
    model = _model(seed=4)
    leaf_l, leaf_r = BinaryTree.leaf(5, label=1), BinaryTree.leaf(9, label=3)
    tree = BinaryTree.node(leaf_l, leaf_r, label=0)
    cell = model.cell
    h_l, c_l = cell.leaf(model.embedding.weight[5])
    h_r, c_r = cell.leaf(model.embedding.weight[9])
    h, _ = cell(h_l, c_l, h_r, c_r)
    logits = model.output(torch.stack([h_l, h_r, h]))
    expected = torch.nn.functional.cross_entropy(logits, torch.tensor([1, 3, 0]), reduction="sum")
    torch.testing.assert_close(per_tree_loss(model, tree), expected)


def test_float32_training_step_runs():
    torch.manual_seed(0)
    model = TreeLSTMClassifier(100, emb_dim=16, hidden=8, dropout=0.2)
    sgd = torch.optim.SGD(model.parameters(), lr=0.002)
    trees = random_trees(16, 2, 20, rng=0, vocab_size=100)
    model.eval()
    before = level_batched_loss(model, trees).item()
    model.train()
    for _ in range(10):
        sgd.zero_grad()
        level_batched_loss(model, trees).backward()
        sgd.step()
    model.eval()
    assert level_batched_loss(model, trees).item() < before


@pytest.mark.parametrize(
    ("kind", "cell_keys"),
    [
        (TreeLSTMClassifier, ["leaf_gates", "node_gates"]),
        (TreeRNNClassifier, ["leaf_layer", "node_layer"]),
    ],
)
def test_classifiers_keep_their_checkpoint_keys_and_dropout(kind, cell_keys):
    model = kind(10, emb_dim=4, hidden=3, n_classes=5, dropout=0.5)
    cell = [f"cell.{name}.{p}" for name in cell_keys for p in ("weight", "bias")]
    assert list(model.state_dict()) == ["embedding.weight", *cell, "output.weight", "output.bias"]
    assert model.output.in_features == 3 and model.embedding.embedding_dim == 4
    model.eval()  # dropout is off: the logits are the output layer's
    h = torch.randn(2, 3)
    torch.testing.assert_close(model(h), model.output(h))
    model.train()
    torch.manual_seed(0)
    dropped = model.embed(torch.tensor([1, 2, 3]))
    assert bool((dropped == 0).any())  # dropout applies to word vectors in training
    assert isinstance(kind(10, dropout=0.0).dropout, torch.nn.Identity)


def test_tree_rnn_classifier_is_importable_from_the_sst_task():
    from batchfold.training.sst import TreeRNNClassifier as FromTask

    assert FromTask is TreeRNNClassifier
