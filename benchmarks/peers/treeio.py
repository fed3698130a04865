"""Input, weights and a NumPy reference shared by the peer Tree-LSTM benchmarks.

This module needs only the standard library and NumPy, so that it can be imported from the
peer systems' own virtual environments (``benchmarks/.peers/<peer>``) without batchfold.

Tree file (JSON)
----------------
Either a plain list of trees, or an object ``{"trees": [...], "labels": [...]}``.

* A tree is nested lists: a leaf is an int word id, an internal node is ``[left, right]``.
  Example: ``[[3, 17], 5]`` is a root over (an internal node over words 3 and 17) and word 5.
* ``labels`` (optional) is one structure per tree, parallel to it: a leaf's label is an int,
  an internal node's is ``[label, left_labels, right_labels]``. Example for the tree above:
  ``[4, [1, 0, 2], 3]``.
* Without ``labels`` every node is labelled by a fixed rule: a leaf with word ``w`` gets
  ``w % 5``; an internal node gets ``(label(left) + label(right)) % 5``.

Weights file (.npz)
-------------------
Rows are output units, columns inputs (``y = W x + b``); H = 150 (hidden), E = 300
(embedding), C = 5 (classes), V = vocabulary size:

=============  ===========  ==========================================================
name           shape        meaning
=============  ===========  ==========================================================
embedding      [V, E]       word vectors
leaf_W         [3H, E]      leaf gates from the word vector; rows in order i, o, u
leaf_b         [3H]
internal_U     [5H, 2H]     internal gates from ``[h_left; h_right]``; rows in order
                            i, f_left, f_right, o, u
internal_b     [5H]
out_W          [C, H]       output layer applied to every node's ``h``
out_b          [C]
=============  ===========  ==========================================================

Model (binary N-ary Tree-LSTM, Tai et al. 2015)::

    leaf:      i, o, u = split(leaf_W x + leaf_b)
               c = sigmoid(i) * tanh(u);  h = sigmoid(o) * tanh(c)
    internal:  i, fl, fr, o, u = split(internal_U [h_l; h_r] + internal_b)
               c = sigmoid(i) * tanh(u) + sigmoid(fl) * c_l + sigmoid(fr) * c_r
               h = sigmoid(o) * tanh(c)
    loss:      sum over every node of every tree of cross_entropy(out_W h + out_b, label)

Command line::

    python treeio.py gen OUT.json [--n 512] [--min-leaves 2] [--max-leaves 60]
                                  [--vocab 1000] [--seed 0] [--labels]
    python treeio.py weights OUT.npz [--vocab 1000] [--seed 0]
    python treeio.py ref TREES.json [--weights W.npz] [--vocab 1000] [--seed 0]

``ref`` prints ``{"system": "numpy", "loss": ...}``: the summed loss over all trees, to
compare with each peer's ``--loss-only`` output.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from dataclasses import dataclass

import numpy as np

EMB = 300
HIDDEN = 150
CLASSES = 5

WEIGHT_SHAPES = {
    "embedding": (None, EMB),
    "leaf_W": (3 * HIDDEN, EMB),
    "leaf_b": (3 * HIDDEN,),
    "internal_U": (5 * HIDDEN, 2 * HIDDEN),
    "internal_b": (5 * HIDDEN,),
    "out_W": (CLASSES, HIDDEN),
    "out_b": (CLASSES,),
}


@dataclass
class FlatTree:
    """One tree in post-order: children come before their parent; the root is last.

    ``word[k]`` is the word id of a leaf (-1 for internal nodes); ``left[k]``/``right[k]`` are
    the children's indices (-1 for leaves); ``label[k]`` is the node's class.
    """

    word: list[int]
    left: list[int]
    right: list[int]
    label: list[int]

    @property
    def size(self) -> int:
        return len(self.word)

    def levels(self) -> list[int]:
        """Height above the leaves of every node (leaves are 0)."""
        lev = [0] * self.size
        for k in range(self.size):
            if self.left[k] >= 0:
                lev[k] = 1 + max(lev[self.left[k]], lev[self.right[k]])
        return lev


def flatten(tree, labels=None) -> FlatTree:
    """Post-order flattening of a nested-list tree (and its optional parallel labels)."""
    out = FlatTree([], [], [], [])
    # Iterative post-order: (node, labels, state); state 0 = children not yet pushed.
    stack = [(tree, labels, False)]
    done: list[int] = []  # indices of finished subtrees, in order
    while stack:
        node, lab, expanded = stack.pop()
        if isinstance(node, bool) or not isinstance(node, (int, list)):
            raise ValueError(f"bad tree node: {node!r}")
        if isinstance(node, int):
            out.word.append(node)
            out.left.append(-1)
            out.right.append(-1)
            if lab is None:
                out.label.append(node % CLASSES)
            else:
                if not isinstance(lab, int):
                    raise ValueError(f"label of leaf {node} must be an int, got {lab!r}")
                out.label.append(lab)
            done.append(out.size - 1)
            continue
        if len(node) != 2:
            raise ValueError(f"internal node must have two children: {node!r}")
        if lab is not None and (not isinstance(lab, list) or len(lab) != 3):
            raise ValueError(f"label of internal node must be [label, left, right]: {lab!r}")
        if not expanded:
            stack.append((node, lab, True))
            stack.append((node[1], None if lab is None else lab[2], False))
            stack.append((node[0], None if lab is None else lab[1], False))
        else:
            r = done.pop()
            left = done.pop()
            out.word.append(-1)
            out.left.append(left)
            out.right.append(r)
            if lab is None:
                out.label.append((out.label[left] + out.label[r]) % CLASSES)
            else:
                out.label.append(int(lab[0]))
            done.append(out.size - 1)
    return out


def load_trees(path: str) -> list[FlatTree]:
    """Read a tree file (see the module docstring) into post-order :class:`FlatTree` values."""
    with open(path) as f:
        data = json.load(f)
    if isinstance(data, dict):
        trees = data["trees"]
        labels = data.get("labels")
        if labels is not None and len(labels) != len(trees):
            raise ValueError("'labels' must have one entry per tree")
    else:
        trees, labels = data, None
    return [flatten(t, None if labels is None else labels[i]) for i, t in enumerate(trees)]


def max_word(trees: list[FlatTree]) -> int:
    return max(max(t.word) for t in trees)


def random_nested_tree(n_leaves: int, vocab: int, rng: random.Random):
    """A random binary tree: a node over k leaves gives uniform{1..k-1} of them to the left."""
    if n_leaves == 1:
        return rng.randrange(vocab)
    k = rng.randint(1, n_leaves - 1)
    return [random_nested_tree(k, vocab, rng), random_nested_tree(n_leaves - k, vocab, rng)]


def _random_labels(tree, rng: random.Random):
    if isinstance(tree, int):
        return rng.randrange(CLASSES)
    return [rng.randrange(CLASSES), _random_labels(tree[0], rng), _random_labels(tree[1], rng)]


def generate(n: int, min_leaves: int, max_leaves: int, vocab: int, seed: int, labels: bool):
    rng = random.Random(seed)
    trees = [random_nested_tree(rng.randint(min_leaves, max_leaves), vocab, rng) for _ in range(n)]
    if not labels:
        return trees
    return {"trees": trees, "labels": [_random_labels(t, rng) for t in trees]}


def make_weights(vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Deterministic float32 weights with the layout of the module docstring."""
    rng = np.random.default_rng(seed)

    def u(shape, fan_in):
        bound = 1.0 / np.sqrt(fan_in)
        return rng.uniform(-bound, bound, size=shape).astype(np.float32)

    return {
        "embedding": rng.normal(0.0, 1.0, size=(vocab, EMB)).astype(np.float32),
        "leaf_W": u((3 * HIDDEN, EMB), EMB),
        "leaf_b": u((3 * HIDDEN,), EMB),
        "internal_U": u((5 * HIDDEN, 2 * HIDDEN), 2 * HIDDEN),
        "internal_b": u((5 * HIDDEN,), 2 * HIDDEN),
        "out_W": u((CLASSES, HIDDEN), HIDDEN),
        "out_b": u((CLASSES,), HIDDEN),
    }


def load_weights(path: str | None, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Weights from ``path`` (checked against the layout), or :func:`make_weights` if None."""
    if path is None:
        return make_weights(vocab, seed)
    with np.load(path) as z:
        w = {k: np.ascontiguousarray(z[k], dtype=np.float32) for k in WEIGHT_SHAPES}
    for k, shape in WEIGHT_SHAPES.items():
        got = w[k].shape
        if len(got) != len(shape) or any(
            s is not None and s != g for s, g in zip(shape, got, strict=True)
        ):
            raise ValueError(f"weight {k!r} has shape {got}, expected {shape}")
    if w["embedding"].shape[0] < vocab:
        raise ValueError(f"embedding has {w['embedding'].shape[0]} rows, need {vocab}")
    return w


def _sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def numpy_loss(trees: list[FlatTree], w: dict[str, np.ndarray]) -> float:
    """Summed node cross-entropy, computed one node at a time in float64."""
    w64 = {k: v.astype(np.float64) for k, v in w.items()}
    H = HIDDEN
    total = 0.0
    for t in trees:
        hs = [None] * t.size
        cs = [None] * t.size
        for k in range(t.size):
            if t.left[k] < 0:
                g = w64["leaf_W"] @ w64["embedding"][t.word[k]] + w64["leaf_b"]
                i, o, u = g[:H], g[H : 2 * H], g[2 * H :]
                c = _sig(i) * np.tanh(u)
            else:
                x = np.concatenate([hs[t.left[k]], hs[t.right[k]]])
                g = w64["internal_U"] @ x + w64["internal_b"]
                i, fl, fr, o, u = (g[j * H : (j + 1) * H] for j in range(5))
                c = _sig(i) * np.tanh(u) + _sig(fl) * cs[t.left[k]] + _sig(fr) * cs[t.right[k]]
            h = _sig(o) * np.tanh(c)
            hs[k], cs[k] = h, c
            z = w64["out_W"] @ h + w64["out_b"]
            m = z.max()
            total += float(m + np.log(np.exp(z - m).sum()) - z[t.label[k]])
    return total


def make_batches(trees: list, batch_size: int) -> list[list]:
    """Consecutive full batches; if there are fewer trees than one batch, trees are cycled."""
    if len(trees) < batch_size:
        reps = -(-batch_size // len(trees))
        return [(trees * reps)[:batch_size]]
    n = len(trees) // batch_size
    return [trees[i * batch_size : (i + 1) * batch_size] for i in range(n)]


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def parse_int_list(s: str) -> list[int]:
    return [int(x) for x in s.replace(",", " ").split()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen", help="write random trees")
    g.add_argument("out")
    g.add_argument("--n", type=int, default=512)
    g.add_argument("--min-leaves", type=int, default=2)
    g.add_argument("--max-leaves", type=int, default=60)
    g.add_argument("--vocab", type=int, default=1000)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--labels", action="store_true", help="random labels instead of the rule")
    w = sub.add_parser("weights", help="write a weights .npz")
    w.add_argument("out")
    w.add_argument("--vocab", type=int, default=1000)
    w.add_argument("--seed", type=int, default=0)
    r = sub.add_parser("ref", help="NumPy reference loss")
    r.add_argument("trees")
    r.add_argument("--weights")
    r.add_argument("--vocab", type=int, default=1000)
    r.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.cmd == "gen":
        data = generate(a.n, a.min_leaves, a.max_leaves, a.vocab, a.seed, a.labels)
        with open(a.out, "w") as f:
            json.dump(data, f, separators=(",", ":"))
    elif a.cmd == "weights":
        np.savez(a.out, **make_weights(a.vocab, a.seed))
    else:
        trees = load_trees(a.trees)
        vocab = max(a.vocab, max_word(trees) + 1)
        wts = load_weights(a.weights, vocab, a.seed)
        print(json.dumps({"system": "numpy", "loss": numpy_loss(trees, wts)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
