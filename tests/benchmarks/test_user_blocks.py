"""The Tree-LSTM as a user writes it in blocks (benchmarks/user_blocks.py) equals the per-tree
loss, values and gradients, on random trees; checked in `make test`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from batchfold import blocks  # noqa: E402
from batchfold.data.trees import BinaryTree, random_trees  # noqa: E402
from batchfold.models.tree_lstm import TreeLSTMClassifier, tree_node_losses  # noqa: E402
from user_blocks import user_tree_lstm_blocks  # noqa: E402


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_user_blocks_equal_the_per_tree_loss(scheduler: str) -> None:
    torch.manual_seed(0)
    model = TreeLSTMClassifier(50, emb_dim=7, hidden=5, n_classes=5).double()
    trees = [*random_trees(6, 1, 12, vocab_size=50, rng=1), BinaryTree.leaf(3, label=2)]
    compiled = blocks.compile(user_tree_lstm_blocks(model), scheduler=scheduler)  # type: ignore[arg-type]
    _, metrics = compiled(trees)
    got = metrics["loss"].sum()
    want = torch.stack([loss for tree in trees for loss in tree_node_losses(model, tree)]).sum()
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    params = list(model.parameters())
    for g, w in zip(
        torch.autograd.grad(got, params), torch.autograd.grad(want, params), strict=True
    ):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)
    assert len(metrics["loss"]) == sum(tree.size for tree in trees)
