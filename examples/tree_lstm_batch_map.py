"""A Tree-LSTM written for one tree (nested pairs of word ids), trained batched by batch_map.

``bf.batch_map(model, trees)`` runs the same ops of all trees together; gradients reach every
parameter. Task: the leftmost word's class. Run: ``python examples/tree_lstm_batch_map.py``.
"""

import random
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import batchfold as bf

VOCAB, DIM, CLASSES = 30, 24, 3


class TreeLSTM(nn.Module):
    """A binary Tree-LSTM (Tai et al., 2015) that reads one tree and gives its root's logits."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.leaf = nn.Linear(DIM, 3 * DIM)  # input, output and update gates of a leaf
        self.node = nn.Linear(2 * DIM, 5 * DIM)  # ... and a forget gate per child
        self.out = nn.Linear(DIM, CLASSES)

    def encode(self, tree: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(tree, int):  # a leaf: a word id
            i, o, u = self.leaf(self.embed(torch.tensor(tree))).chunk(3)
            c = i.sigmoid() * u.tanh()
            return o.sigmoid() * c.tanh(), c
        (hl, cl), (hr, cr) = self.encode(tree[0]), self.encode(tree[1])
        i, fl, fr, o, u = self.node(torch.cat([hl, hr])).chunk(5)
        c = i.sigmoid() * u.tanh() + fl.sigmoid() * cl + fr.sigmoid() * cr
        return o.sigmoid() * c.tanh(), c

    def forward(self, tree: Any) -> torch.Tensor:
        return self.out(self.encode(tree)[0])


def random_tree(rng: random.Random, leaves: int) -> Any:
    """A random binary tree with ``leaves`` random word ids."""
    if leaves == 1:
        return rng.randrange(VOCAB)
    k = rng.randint(1, leaves - 1)
    return (random_tree(rng, k), random_tree(rng, leaves - k))


def label(tree: Any) -> int:
    """The class of the tree's leftmost word."""
    return tree % CLASSES if isinstance(tree, int) else label(tree[0])


def main(steps: int = 40, batch: int = 32) -> None:
    """Train on ``steps`` batches of ``batch`` random trees; print losses, stats and a plan."""
    torch.manual_seed(0)
    model, rng = TreeLSTM(), random.Random(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    for step in range(1, steps + 1):
        trees = [random_tree(rng, rng.randint(1, 8)) for _ in range(batch)]
        logits, stats = bf.batch_map(model, trees, return_stats=True)  # one tensor per tree
        loss = F.cross_entropy(torch.stack(logits), torch.tensor([label(t) for t in trees]))
        optimizer.zero_grad()
        loss.backward()  # through the batched steps to every parameter
        optimizer.step()
        if step % 10 == 0 or step == 1:
            print(f"step {step:2d}: loss {loss.item():.3f}")
    trees = [((1, 2), 3), (4, (5, (6, 7))), 8]  # the README's three trees
    roots, stats = bf.batch_map(model, trees, return_stats=True)
    difference = (torch.stack(roots) - torch.stack([model(t) for t in trees])).abs().max()
    print(f"\nbatched vs one tree at a time: max difference {difference:.1e}")
    print(stats)  # nodes, batched steps, mean batch, time per phase
    print(stats.plan)  # one line per batched step


if __name__ == "__main__":
    main()
