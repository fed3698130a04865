"""Batch a Tree-LSTM over random trees with batch_map, and compare with one tree at a time.

Run with ``make demo`` (or ``python examples/demo.py``). Prints what was batched, where the
time went, and the speedup of one batched training step over running each tree alone.
"""

from __future__ import annotations

import random
import time

import torch

import batchfold as bf
from batchfold.data.trees import random_trees
from batchfold.models.tree_lstm import TreeLSTMClassifier, tree_node_losses


def main() -> None:
    """Time one training step both ways on the same trees and weights."""
    torch.manual_seed(0)
    torch.set_num_threads(2)
    model = TreeLSTMClassifier(vocab_size=1000, emb_dim=300, hidden=150)
    leaf = bf.function(model.cell.leaf, batched=True)  # one node per cell call
    node = bf.function(model.cell, batched=True)
    trees = random_trees(128, 2, 60, random.Random(0), vocab_size=1000, n_classes=5)
    print(f"{len(trees)} random binary trees, 2-60 leaves, {sum(t.size for t in trees)} nodes")

    def batched() -> torch.Tensor:
        losses = bf.batch_map(lambda t: tree_node_losses(model, t, leaf, node), trees)
        return torch.stack([loss for tree in losses for loss in tree]).sum()

    def one_at_a_time() -> torch.Tensor:
        return torch.stack(
            [loss for t in trees for loss in tree_node_losses(model, t, leaf, node)]
        ).sum()

    timings = {}
    for name, run in (("batchfold", batched), ("one tree at a time", one_at_a_time)):
        model.zero_grad()
        start = time.perf_counter()
        loss = run()
        loss.backward()
        timings[name] = time.perf_counter() - start
        print(f"{name:>20s}: loss {loss.item():.4f}, {len(trees) / timings[name]:7.1f} trees/s")
    stats = bf.last_stats()
    assert stats is not None and stats.plan is not None
    print(f"\nbatchfold: {stats}")
    print("\nfirst steps of the plan:")
    print("\n".join(str(stats.plan).splitlines()[:8]))
    speedup = timings["one tree at a time"] / timings["batchfold"]
    print(f"\nspeedup over one tree at a time: {speedup:.1f}x")


if __name__ == "__main__":
    main()
