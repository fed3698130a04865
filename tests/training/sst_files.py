"""Tiny SST-format data sets and the options of a tiny, fast training run."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from batchfold.data.sst import Tree

WORDS = ["good", "bad", "movie", "the", "-LRB-", "fun", "dull", "plot", "a", "great", "1\\/2"]


@dataclass(frozen=True)
class TinySST:
    """Where the tiny data set lives."""

    data: Path
    glove: Path

    def train_argv(self, out: Path, *extra: str) -> list[str]:
        """``batchfold train sst`` options for a tiny, fast run writing to ``out``."""
        return [
            "train",
            "sst",
            *("--data", str(self.data), "--glove", str(self.glove), "--word-dim", "4"),
            *("--hidden", "4", "--batch-size", "4", "--epochs", "2", "--threads", "1"),
            *("--lr-schedule", "constant"),  # so a resumed run may add epochs
            *("--out", str(out), "--compare-batches", "1", "--eval-batch-size", "5"),
            *extra,
        ]


def random_tree(rng: random.Random, n_leaves: int) -> Tree:
    """A random binary tree with random words and labels 0-4."""
    nodes = [Tree(rng.randrange(5), rng.choice(WORDS), ()) for _ in range(n_leaves)]
    while len(nodes) > 1:
        i = rng.randrange(len(nodes) - 1)
        nodes[i : i + 2] = [Tree(rng.randrange(5), None, (nodes[i], nodes[i + 1]))]
    return nodes[0]


def write_sst(folder: Path, sizes: dict[str, int], seed: int = 0) -> None:
    """Write ``<split>.txt`` files of random trees in the SST PTB format."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for split, count in sizes.items():
        lines = [str(random_tree(rng, rng.randint(1, 7))) for _ in range(count)]
        (folder / f"{split}.txt").write_text("\n".join(lines) + "\n")


def make_tiny_sst(folder: Path) -> TinySST:
    """16 training, 6 dev and 7 test trees, and 4-d vectors for most of their words."""
    data = folder / "sst"
    write_sst(data, {"train": 16, "dev": 6, "test": 7})
    glove = folder / "glove.txt"
    rng = random.Random(1)
    lines = [
        " ".join([word, *(f"{rng.uniform(-1, 1):.3f}" for _ in range(4))])
        for word in ("good", "bad", "movie", "the", "(", "fun", "great")
    ]
    glove.write_text("\n".join(lines) + "\n")
    return TinySST(data, glove)
