from __future__ import annotations

import pytest
import torch

from batchfold.data.trees import BinaryTree
from batchfold.models.tree_lstm import (
    BinaryTreeLSTMCell,
    FoldBenchmarkCell,
    TreeLSTMClassifier,
    TreeRNNCell,
    TreeRNNClassifier,
    per_tree_loss,
)


def _model(seed: int = 0, vocab: int = 1000) -> TreeLSTMClassifier:
    torch.manual_seed(seed)
    model = TreeLSTMClassifier(vocab, emb_dim=7, hidden=5, n_classes=5).double()
    for p in model.parameters():  # larger weights than the default, to exercise the gates
        torch.nn.init.uniform_(p, -1.0, 1.0)
    return model


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
    i, o, u = (cell.leaf.gates.weight @ x + cell.leaf.gates.bias).view(3, 2)
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


@pytest.mark.parametrize(
    ("kind", "cell_keys"),
    [
        (TreeLSTMClassifier, ["leaf.gates", "node_gates"]),
        (TreeRNNClassifier, ["leaf_layer", "node_layer"]),
    ],
)
def test_classifiers_checkpoint_keys_and_dropout(kind, cell_keys):
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


def test_tree_lstm_loads_checkpoints_that_name_the_leaf_layer_leaf_gates():
    torch.manual_seed(0)
    model = TreeLSTMClassifier(10, emb_dim=4, hidden=3)
    old = {k.replace("leaf.gates", "leaf_gates"): v for k, v in model.state_dict().items()}
    assert "cell.leaf_gates.weight" in old
    loaded = TreeLSTMClassifier(10, emb_dim=4, hidden=3)
    loaded.load_state_dict(old)
    for name, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name


def test_tree_rnn_classifier_is_importable_from_the_sst_task():
    from batchfold.training.sst import TreeRNNClassifier as FromTask

    assert FromTask is TreeRNNClassifier
