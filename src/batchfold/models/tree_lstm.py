"""Tree-LSTM and Tree-RNN node-level classifiers, and their one-tree reference loss.

The classifiers put word vectors and an output layer around a cell of
:mod:`batchfold.models.tree_cells` (whose cells are importable from here as well).

:func:`per_tree_loss` is the unbatched reference: the summed cross-entropy of every node's
label, one node at a time. :func:`tree_node_losses` is the same loss as single-instance code
for ``batchfold.batch_map``. The plain-PyTorch baselines that the benchmarks compare against
(naive per-tree, hand-written level batching) are in ``benchmarks/baselines.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from batchfold.data.trees import BinaryTree
from batchfold.models.tree_cells import (
    BinaryTreeLSTMCell,
    FoldBenchmarkCell,
    TreeLSTMLeaf,
    TreeRNNCell,
)

__all__ = [
    "BinaryTreeLSTMCell",
    "FoldBenchmarkCell",
    "TreeClassifier",
    "TreeLSTMClassifier",
    "TreeLSTMLeaf",
    "TreeRNNCell",
    "TreeRNNClassifier",
    "per_tree_loss",
    "tree_node_logits",
    "tree_node_losses",
]


CellT = TypeVar("CellT", bound=nn.Module)


class TreeClassifier(nn.Module, Generic[CellT]):
    """A tree cell plus the layers that classify every node of a binary tree (as on SST).

    Word vectors feed the leaves; each node's ``h`` goes through dropout and a linear output
    layer to give its class logits. Dropout (when ``dropout > 0``) applies to word vectors and
    to ``h`` before the output layer. A subclass names its cell in ``cell_class``, made as
    ``cell_class(emb_dim, hidden)``.

    Arguments:
        vocab_size: the number of word ids.
        emb_dim: the word vector size.
        hidden: the cell's state size.
        n_classes: the number of labels.
        dropout: the dropout probability.
        recurrent_dropout: the Tree-LSTM cell's dropout probability on its candidate (see
            :class:`BinaryTreeLSTMCell`).
    """

    cell_class: type[CellT]

    def __init__(
        self,
        vocab_size: int,
        emb_dim: int = 300,
        hidden: int = 150,
        n_classes: int = 5,
        dropout: float = 0.0,
        recurrent_dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, emb_dim)
        if recurrent_dropout > 0 and self.cell_class is not BinaryTreeLSTMCell:
            raise ValueError("recurrent dropout applies to the Tree-LSTM cell only")
        options = {"recurrent_dropout": recurrent_dropout} if recurrent_dropout > 0 else {}
        self.cell: CellT = self.cell_class(emb_dim, hidden, **options)
        self.dropout: nn.Module = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.output = nn.Linear(hidden, n_classes)

    def embed(self, words: Tensor) -> Tensor:
        """Word vectors (with dropout) for word ids.

        Arguments:
            words: word ids, ``[...]`` (int64).

        Returns:
            ``[..., emb_dim]``.
        """
        return self.dropout(self.embedding(words))

    def forward(self, h: Tensor) -> Tensor:
        """Class logits from node states.

        Arguments:
            h: node states, ``[..., hidden]``.

        Returns:
            Logits, ``[..., n_classes]``.
        """
        return self.output(self.dropout(h))


class TreeLSTMClassifier(TreeClassifier[BinaryTreeLSTMCell]):
    """A :class:`TreeClassifier` with the Tree-LSTM cell :class:`BinaryTreeLSTMCell`.

    Its node state is ``(h, c)``; ``h`` goes to the output layer. The arguments are
    :class:`TreeClassifier`'s.

    Example:
        >>> model = TreeLSTMClassifier(100, emb_dim=6, hidden=4)
        >>> h, c = model.cell.leaf(model.embed(torch.tensor([1, 2, 3])))
        >>> tuple(model(h).shape)
        (3, 5)
    """

    cell_class = BinaryTreeLSTMCell

    def leaf_state(self, words: Tensor) -> tuple[Tensor, Tensor]:
        """Leaves' ``(h, c)`` from their word ids: the word vectors (with dropout), then the
        cell's leaf form (one step of :func:`~batchfold.models.tree_lstm_blocks`)."""
        return self.cell.leaf(self.embed(words))

    def node_state(
        self, left: tuple[Tensor, Tensor], right: tuple[Tensor, Tensor]
    ) -> tuple[Tensor, Tensor]:
        """Internal nodes' ``(h, c)`` from their children's."""
        return self.cell(left[0], left[1], right[0], right[1])

    def logits_and_loss(self, h: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        """Nodes' class logits and each node's cross-entropy against its label."""
        logits = self(h)
        return logits, F.cross_entropy(logits, labels, reduction="none")


class TreeRNNClassifier(TreeClassifier[TreeRNNCell]):
    """A :class:`TreeClassifier` with the Socher-style Tree-RNN cell :class:`TreeRNNCell`.

    Its node state is the single vector ``h``. The arguments are :class:`TreeClassifier`'s.

    Example:
        >>> model = TreeRNNClassifier(100, emb_dim=6, hidden=4)
        >>> h = model.cell.leaf(model.embed(torch.tensor([1, 2, 3])))
        >>> tuple(model(h).shape)
        (3, 5)
    """

    cell_class = TreeRNNCell


def per_tree_loss(model: TreeLSTMClassifier, tree: BinaryTree) -> Tensor:
    """The summed cross-entropy of every node of one tree, computed one node at a time.

    This is the unbatched reference: a post-order walk (no recursion) calling the cell once per
    node and the output layer once per node. The tree's word vectors are looked up in one call.

    Arguments:
        model: the classifier.
        tree: the tree; every node's ``label`` is its target.

    Returns:
        A scalar loss.

    Example:
        >>> from batchfold.data.trees import random_tree
        >>> _ = torch.manual_seed(0)
        >>> model = TreeLSTMClassifier(1000, emb_dim=8, hidden=4)
        >>> per_tree_loss(model, random_tree(5, rng=0)).shape
        torch.Size([])
    """
    cell = model.cell
    words = [n.word for n in tree.nodes() if n.left is None]
    x = model.embed(torch.tensor(words, device=model.output.weight.device))  # [n_leaves, emb]
    n_read = 0
    stack: list[tuple[Tensor, Tensor]] = []
    losses: list[Tensor] = []
    for node in tree.nodes():
        if node.left is None:
            h, c = cell.leaf(x[n_read])
            n_read += 1
        else:
            h_r, c_r = stack.pop()
            h_l, c_l = stack.pop()
            h, c = cell(h_l, c_l, h_r, c_r)
        stack.append((h, c))
        losses.append(-F.log_softmax(model(h), dim=-1)[node.label])
    return torch.stack(losses).sum()


def tree_node_logits(
    model: TreeLSTMClassifier | TreeRNNClassifier,
    tree: BinaryTree,
    leaf: Callable[..., Any] | None = None,
    node: Callable[..., Any] | None = None,
) -> list[Tensor]:
    """Class logits of every node of one tree: plain single-instance code for ``batch_map``.

    Run eagerly it computes one node at a time; inside ``batchfold.batch_map`` it is recorded
    for every tree of a batch and run batched. ``leaf`` and ``node`` default to the model's
    cell; pass ``batchfold.function(cell, batched=True)`` wrappers to record each cell call as
    one node. A cell state is ``(h, c)`` (Tree-LSTM) or ``h`` (Tree-RNN); ``node`` gets the
    left child's state parts, then the right child's.

    Arguments:
        model: the classifier.
        tree: one tree of word ids.
        leaf: the leaf function (default ``model.cell.leaf``).
        node: the internal-node function (default ``model.cell``).

    Returns:
        One ``[n_classes]`` logit vector per node, in post-order (the root last).

    Example:
        >>> import batchfold as bf
        >>> _ = torch.manual_seed(0)
        >>> model = TreeLSTMClassifier(10, emb_dim=4, hidden=3)
        >>> tree = BinaryTree.node(BinaryTree.leaf(1), BinaryTree.leaf(2))
        >>> batched = bf.batch_map(lambda t: tree_node_logits(model, t), [tree])[0]
        >>> [torch.allclose(a, b) for a, b in zip(batched, tree_node_logits(model, tree))]
        [True, True, True]
    """
    leaf = leaf or model.cell.leaf
    node = node or model.cell
    device = model.output.weight.device
    states: list[tuple[Tensor, ...]] = []
    logits: list[Tensor] = []
    for n in tree.nodes():  # post-order, iterative
        if n.left is None:
            out = leaf(model.embed(torch.tensor(n.word, device=device)))
        else:
            right = states.pop()
            left = states.pop()
            out = node(*left, *right)
        state = out if isinstance(out, tuple) else (out,)
        states.append(state)
        logits.append(model(state[0]))
    return logits


def tree_node_losses(
    model: TreeLSTMClassifier | TreeRNNClassifier,
    tree: BinaryTree,
    leaf: Callable[..., Any] | None = None,
    node: Callable[..., Any] | None = None,
) -> list[Tensor]:
    """The cross-entropy of every node of one tree: plain single-instance code for ``batch_map``.

    Run eagerly, it computes one tree one node at a time; inside ``batchfold.batch_map`` the
    same code is recorded for every tree of a batch and run batched. ``leaf`` and ``node``
    default to the model's cell; pass ``batchfold.function(cell, batched=True)`` wrappers to
    record each cell call as one node. These are the cross-entropies of
    :func:`tree_node_logits`.

    Arguments:
        model: the classifier.
        tree: one tree; every node's ``label`` is its target.
        leaf: the leaf function (default ``model.cell.leaf``).
        node: the internal-node function (default ``model.cell``).

    Returns:
        One scalar loss per node, in post-order.

    Example:
        >>> import batchfold as bf
        >>> from batchfold.data.trees import random_tree
        >>> _ = torch.manual_seed(0)
        >>> model = TreeLSTMClassifier(1000, emb_dim=8, hidden=4)
        >>> tree = random_tree(5, rng=0)
        >>> (batched,) = bf.batch_map(lambda t: tree_node_losses(model, t), [tree])
        >>> eager = tree_node_losses(model, tree)
        >>> len(batched) == tree.size and torch.allclose(torch.stack(batched), torch.stack(eager))
        True
    """
    device = model.output.weight.device
    return [
        F.cross_entropy(logits, torch.tensor(n.label, device=device))
        for logits, n in zip(tree_node_logits(model, tree, leaf, node), tree.nodes(), strict=True)
    ]
