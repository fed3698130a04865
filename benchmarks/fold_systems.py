"""The systems of TensorFlow Fold's ICLR 2017 benchmark, on the cell ``FoldBenchmarkCell``.

``bench_fold.py`` times them. Each system is a runner: a batch of trees -> Fold's L2 loss on
the roots. ``fold_root`` is the per-tree code (run eagerly by ``naive_runner`` and through
``batch_map`` by :class:`BatchfoldRunner`); :func:`fold_blocks` is the same model as blocks
(run by :class:`BlocksRunner`); :class:`ManualRunner` and :class:`NodeByNodeRunner` are
hand-built batching over trees of one shared shape. :func:`check_systems` checks them all
against the one-tree-at-a-time run.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

import batchfold as bf
from batchfold import blocks
from batchfold.data.trees import BinaryTree, random_tree
from batchfold.models.tree_lstm import FoldBenchmarkCell
from batchfold.schedule import Scheduler
from roofline import Matmul

LEAVES = 128
VOCAB = 128  # Fold's script: an embedding table with one row per leaf of a tree
MODES = ("full dynamic", "dynamic")
Tensor = torch.Tensor
Runner = Callable[[Sequence[BinaryTree]], Tensor]


def fold_root(
    tree: BinaryTree, leaf: Callable[[Tensor], Tensor], node: Callable[[Tensor, Tensor], Tensor]
) -> Tensor:
    """The root state of one tree: plain single-instance code (post-order, no recursion).

    Arguments:
        tree: the tree; leaves hold embedding rows.
        leaf: word id (a 0-d int64 tensor) -> state.
        node: (left state, right state) -> state.

    Returns:
        The root's state, ``[d]``.
    """
    states: list[Tensor] = []
    for n in tree.nodes():
        if n.left is None:
            states.append(leaf(torch.tensor(n.word)))
        else:
            right, left = states.pop(), states.pop()
            states.append(node(left, right))
    return states[0]


def l2_loss(roots: Tensor) -> Tensor:
    """Fold's loss: half the summed squares of the roots' states (``tf.nn.l2_loss``)."""
    return 0.5 * roots.pow(2).sum()


def reword(shape: BinaryTree, rng: random.Random) -> BinaryTree:
    """A tree of the same shape as ``shape`` with fresh uniform leaf words."""
    stack: list[BinaryTree] = []
    for n in shape.nodes():
        if n.left is None:
            stack.append(BinaryTree.leaf(rng.randrange(VOCAB)))
        else:
            right, left = stack.pop(), stack.pop()
            stack.append(BinaryTree.node(left, right))
    return stack[0]


def make_batch(mode: str, shape: BinaryTree, size: int, rng: random.Random) -> list[BinaryTree]:
    """A batch of the mode: fresh random shapes (``full dynamic``) or ``shape`` reworded."""
    if mode == "full dynamic":
        return [random_tree(LEAVES, rng, VOCAB, n_classes=1) for _ in range(size)]
    return [reword(shape, rng) for _ in range(size)]


def heights(tree: BinaryTree) -> list[int]:
    """Height above the leaves of every node, in post-order."""
    out: list[int] = []
    stack: list[int] = []  # heights of finished subtrees
    for n in tree.nodes():
        h = 0 if n.left is None else max(stack.pop(), stack.pop()) + 1
        stack.append(h)
        out.append(h)
    return out


@dataclass(frozen=True)
class Rows:
    """Where a level's children come from: pieces of lower levels, then a reordering.

    ``pieces`` are ``(level, rows)``: ``rows`` a slice or an index tensor into that level;
    their concatenation, permuted by ``order`` (when set), lines up with the level's nodes.
    """

    pieces: tuple[tuple[int, slice | Tensor], ...]
    order: Tensor | None

    def gather(self, levels: list[Tensor]) -> Tensor:
        """The rows from per-level states ``[m_j, batch, d]`` -> ``[m, batch, d]``."""
        parts = [
            levels[j][rows] if isinstance(rows, slice) else levels[j].index_select(0, rows)
            for j, rows in self.pieces
        ]
        x = parts[0] if len(parts) == 1 else torch.cat(parts)
        return x if self.order is None else x.index_select(0, self.order)


def _rows(sources: list[tuple[int, int]]) -> Rows:
    """:class:`Rows` for children at ``(level, position)``, in the order given."""
    levels = sorted({j for j, _ in sources})
    pieces: list[tuple[int, slice | Tensor]] = []
    arrival: list[int] = []  # output position of each concatenated row
    for j in levels:
        mine = [(p, k) for k, (lj, p) in enumerate(sources) if lj == j]
        positions = [p for p, _ in mine]
        arrival += [k for _, k in mine]
        if positions == list(range(positions[0], positions[0] + len(positions))):
            pieces.append((j, slice(positions[0], positions[0] + len(positions))))
        else:
            pieces.append((j, torch.tensor(positions)))
    order = None
    if arrival != sorted(arrival):
        inverse = np.empty(len(arrival), dtype=np.int64)
        inverse[np.asarray(arrival)] = np.arange(len(arrival))
        order = torch.from_numpy(inverse)
    return Rows(tuple(pieces), order)


class ManualRunner:
    """Plain PyTorch over a batch of trees of one shape, batched by hand level by level.

    The gather plan of the shape is built once (as Fold's script builds its TensorFlow graph
    once); per batch, only the words are collected. States are kept per level as
    ``[nodes of the level, batch, d]``, so a level's children are a few row slices or index
    selects of lower levels.

    Arguments:
        cell: the benchmark cell.
        shape: the shape every tree of a batch has.
    """

    def __init__(self, cell: FoldBenchmarkCell, shape: BinaryTree) -> None:
        self.cell = cell
        level_of = heights(shape)
        position: list[int] = []  # each node's position within its level
        counts = [0] * (max(level_of) + 1)
        for h in level_of:
            position.append(counts[h])
            counts[h] += 1
        left: list[list[tuple[int, int]]] = [[] for _ in counts]
        right: list[list[tuple[int, int]]] = [[] for _ in counts]
        stack: list[int] = []  # post-order indices of finished subtrees
        for k, n in enumerate(shape.nodes()):
            if n.left is not None:
                r, lf = stack.pop(), stack.pop()
                left[level_of[k]].append((level_of[lf], position[lf]))
                right[level_of[k]].append((level_of[r], position[r]))
            stack.append(k)
        self.levels = [(_rows(left[h]), _rows(right[h])) for h in range(1, len(counts))]

    def __call__(self, trees: Sequence[BinaryTree]) -> Tensor:
        cell, d = self.cell, self.cell.d
        words = torch.tensor([t.leaves() for t in trees]).t()  # [leaves, batch]
        states = [cell.leaf(words)]  # per level: [nodes, batch, d]
        for left_rows, right_rows in self.levels:
            left, right = left_rows.gather(states), right_rows.gather(states)
            m = left.shape[0]
            states.append(cell(left.reshape(-1, d), right.reshape(-1, d)).view(m, -1, d))
        return l2_loss(states[-1][0])


class NodeByNodeRunner:
    """Fold's "TensorFlow" model: one batched cell call per node of the shared shape.

    Arguments:
        cell: the benchmark cell.
        shape: the shape every tree of a batch has.
    """

    def __init__(self, cell: FoldBenchmarkCell, shape: BinaryTree) -> None:
        self.cell = cell
        self.children: list[tuple[int, int] | None] = []  # per post-order node
        stack: list[int] = []
        for k, n in enumerate(shape.nodes()):
            self.children.append(None if n.left is None else (stack.pop(-2), stack.pop()))
            stack.append(k)

    def __call__(self, trees: Sequence[BinaryTree]) -> Tensor:
        words = torch.tensor([t.leaves() for t in trees]).t()  # [leaves, batch]
        leaves = self.cell.leaf(words)  # [leaves, batch, d]
        states: list[Tensor] = []
        n_leaf = 0
        for pair in self.children:
            if pair is None:
                states.append(leaves[n_leaf])
                n_leaf += 1
            else:
                states.append(self.cell(states[pair[0]], states[pair[1]]))
        return l2_loss(states[-1])


def naive_runner(cell: FoldBenchmarkCell) -> Runner:
    """One tree and one node at a time: :func:`fold_root` run eagerly on each tree."""

    def run(trees: Sequence[BinaryTree]) -> Tensor:
        return l2_loss(torch.stack([fold_root(t, cell.leaf, cell) for t in trees]))

    return run


class BatchfoldRunner:
    """:func:`fold_root` through ``batch_map``; keeps every call's statistics.

    Arguments:
        cell: the benchmark cell.
        scheduler: ``"agenda"`` or ``"depth"``.
    """

    def __init__(self, cell: FoldBenchmarkCell, scheduler: Scheduler) -> None:
        self.scheduler: Scheduler = scheduler
        self.per_tree = partial(
            fold_root,
            leaf=bf.function(cell.leaf, batched=True),
            node=bf.function(cell, batched=True),
        )
        self.stats: list[bf.Stats] = []

    def __call__(self, trees: Sequence[BinaryTree]) -> Tensor:
        roots, stats = bf.batch_map(
            self.per_tree, trees, scheduler=self.scheduler, return_stats=True
        )
        self.stats.append(stats)
        return l2_loss(torch.stack(roots))


def fold_blocks(cell: FoldBenchmarkCell) -> blocks.Block:
    """The benchmark model as blocks on one tree: it gives the root's state, ``[d]``.

    Recursion goes through a ``ForwardDeclaration``; a ``OneOf`` on whether the node is a
    leaf picks the leaf lookup (the word id as an int64 scalar, then ``cell.leaf``) or the
    cell on the two children's states. Both are ``Function`` s of ``cell``, so the compiled
    model shares its weights.

    Arguments:
        cell: the benchmark cell.

    Returns:
        The root block; compile it with ``batchfold.blocks.compile``.
    """
    state = blocks.TensorType((cell.d,), cell.embedding.weight.dtype)
    tree = blocks.ForwardDeclaration(blocks.PyObjectType(), state, name="fold_tree")
    leaf = (
        blocks.InputTransform(_word, name="word")
        >> blocks.Scalar("int64")
        >> blocks.Function(cell.leaf, name="fold_leaf")
    )
    internal = (
        blocks.InputTransform(_children, name="children")
        >> blocks.Record((tree(), tree()))
        >> blocks.Function(cell, name="fold_cell")
    )
    tree.resolve_to(blocks.OneOf(_is_leaf, {True: leaf, False: internal}))
    return tree()


def _is_leaf(node: BinaryTree) -> bool:
    return node.left is None


def _word(node: BinaryTree) -> int:
    if node.word is None:
        raise ValueError("a leaf of a Fold benchmark tree needs a word id")
    return node.word


def _children(node: BinaryTree) -> tuple[BinaryTree, BinaryTree]:
    if node.left is None or node.right is None:
        raise ValueError("an internal node of a Fold benchmark tree needs two children")
    return node.left, node.right


class BlocksRunner:
    """:func:`fold_blocks` compiled; keeps every call's statistics.

    Arguments:
        cell: the benchmark cell.
        scheduler: ``"agenda"`` or ``"depth"``.
    """

    def __init__(self, cell: FoldBenchmarkCell, scheduler: Scheduler) -> None:
        self.compiled = blocks.compile(fold_blocks(cell), scheduler=scheduler)
        self.stats: list[bf.Stats] = []

    def __call__(self, trees: Sequence[BinaryTree]) -> Tensor:
        roots, _ = self.compiled(trees)
        assert self.compiled.last_stats is not None
        self.stats.append(self.compiled.last_stats)
        return l2_loss(roots)


RecordingRunner = BatchfoldRunner | BlocksRunner  # the systems that keep stats


def check_systems(seed: int = 0) -> None:
    """Every system's loss and gradients equal the one-tree-at-a-time run (float64, small).

    Raises:
        RuntimeError: a system disagrees; the message names it.
    """
    torch.manual_seed(seed)
    cell = FoldBenchmarkCell(VOCAB, 8).double()
    rng = random.Random(seed)
    shape = random_tree(16, rng, VOCAB, n_classes=1)
    batches = {
        "dynamic": [reword(shape, rng) for _ in range(4)],
        "full dynamic": [random_tree(16, rng, VOCAB, n_classes=1) for _ in range(4)],
    }
    systems: dict[str, tuple[Runner, tuple[str, ...]]] = {
        "manual": (ManualRunner(cell, shape), ("dynamic",)),
        "manual, node by node": (NodeByNodeRunner(cell, shape), ("dynamic",)),
        "batchfold agenda": (BatchfoldRunner(cell, "agenda"), MODES),
        "batchfold depth": (BatchfoldRunner(cell, "depth"), MODES),
        "batchfold blocks agenda": (BlocksRunner(cell, "agenda"), MODES),
        "batchfold blocks depth": (BlocksRunner(cell, "depth"), MODES),
    }
    for mode, trees in batches.items():
        expected = _loss_and_grads(naive_runner(cell), cell, trees)
        for name, (runner, modes) in systems.items():
            if mode not in modes:
                continue
            got = _loss_and_grads(runner, cell, trees)
            if not all(
                torch.allclose(a, b, rtol=1e-9, atol=1e-12)
                for a, b in zip(got, expected, strict=True)
            ):
                raise RuntimeError(f"{name} ({mode}) does not match the one-tree-at-a-time run")


def _loss_and_grads(runner: Runner, cell: torch.nn.Module, trees: list[BinaryTree]) -> list[Tensor]:
    cell.zero_grad(set_to_none=True)
    loss = runner(trees)
    loss.backward()
    return [loss.detach()] + [p.grad.clone() for p in cell.parameters() if p.grad is not None]


def level_matmuls(trees: Sequence[BinaryTree], d: int) -> list[Matmul]:
    """The matmuls of a batch run level by level (leaves are lookups: no matmul)."""
    per_level = np.zeros(1, dtype=np.int64)
    for t in trees:
        counts = np.bincount(heights(t))
        if len(counts) > len(per_level):
            per_level = np.pad(per_level, (0, len(counts) - len(per_level)))
        per_level[: len(counts)] += counts
    out = []
    for rows in per_level[1:].tolist():
        out += [Matmul(rows, 2 * d, d), Matmul(rows, d, 4 * d)]
    return out
