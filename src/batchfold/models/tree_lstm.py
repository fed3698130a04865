"""Tree-LSTM and Tree-RNN cells, node-level classifiers, and their one-tree reference loss.

The cells work on one instance (``x`` of shape ``[in]``, ``h`` of shape ``[hidden]``) and on a
batch (a leading dimension ``[n, ...]``) alike: they only use ``nn.Linear``, element-wise
functions and ``dim=-1`` splits, with no branching on values.

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


class TreeLSTMLeaf(nn.Module):
    """The leaf of :class:`BinaryTreeLSTMCell`: ``(h, c)`` from an input vector.

    ``i, o, u = split(W x + b)``; ``c = sigmoid(i) * tanh(u)``; ``h = sigmoid(o) * tanh(c)``,
    with ``candidate_dropout`` on ``tanh(u)``.

    Arguments:
        in_dim: the size of the input vector.
        hidden: the size of ``h`` and ``c``.
        candidate_dropout: the module applied to the candidate (the cell's).

    Example:
        >>> h, c = TreeLSTMLeaf(4, 3, nn.Identity())(torch.zeros(7, 4))
        >>> tuple(h.shape), tuple(c.shape)
        ((7, 3), (7, 3))
    """

    def __init__(self, in_dim: int, hidden: int, candidate_dropout: nn.Module) -> None:
        super().__init__()
        self.hidden = hidden
        self.candidate_dropout = candidate_dropout
        self.gates = nn.Linear(in_dim, 3 * hidden)  # -> i, o, u

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The state of a leaf (or a batch of leaves).

        Arguments:
            x: input, ``[..., in_dim]``.

        Returns:
            ``(h, c)``, each ``[..., hidden]``.
        """
        sig, u = self.gates(x).split([2 * self.hidden, self.hidden], dim=-1)
        i, o = torch.sigmoid(sig).chunk(2, dim=-1)
        c = i * self.candidate_dropout(torch.tanh(u))
        return o * torch.tanh(c), c


class BinaryTreeLSTMCell(nn.Module):
    """The binary (N = 2) N-ary Tree-LSTM cell of Tai et al. (2015).

    Leaves: ``i, o, u = split(W x + b)``; ``c = sigmoid(i) * tanh(u)``;
    ``h = sigmoid(o) * tanh(c)``. Internal nodes have no input; with ``U [h_l; h_r] + b`` split
    into ``i, f_l, f_r, o, u`` (a forget gate per child):
    ``c = sigmoid(i) * tanh(u) + sigmoid(f_l) * c_l + sigmoid(f_r) * c_r`` and
    ``h = sigmoid(o) * tanh(c)``.

    With ``recurrent_dropout > 0``, dropout applies to the candidate ``tanh(u)`` (recurrent
    dropout without memory loss, Semeniuta et al. 2016, as in TensorFlow Fold's cell).

    Arguments:
        in_dim: the size of a leaf's input vector.
        hidden: the size of ``h`` and ``c``.
        recurrent_dropout: the dropout probability on the candidate.

    Example:
        >>> cell = BinaryTreeLSTMCell(4, 3)
        >>> h, c = cell.leaf(torch.zeros(4))
        >>> h2, c2 = cell(h, c, h, c)
        >>> tuple(h2.shape), tuple(cell.leaf(torch.zeros(7, 4))[0].shape)
        ((3,), (7, 3))
    """

    def __init__(self, in_dim: int, hidden: int, recurrent_dropout: float = 0.0) -> None:
        super().__init__()
        self.in_dim = in_dim
        self.hidden = hidden
        self.candidate_dropout: nn.Module = (
            nn.Dropout(recurrent_dropout) if recurrent_dropout > 0 else nn.Identity()
        )
        # a module, not a method: inside batch_map a leaf is then one cached call (one node)
        self.leaf = TreeLSTMLeaf(in_dim, hidden, self.candidate_dropout)
        self.node_gates = nn.Linear(2 * hidden, 5 * hidden)  # -> i, f_l, f_r, o, u

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        # checkpoints made before the leaf was a module name its layer ``leaf_gates``
        for part in ("weight", "bias"):
            old, new = f"{prefix}leaf_gates.{part}", f"{prefix}leaf.gates.{part}"
            if old in state_dict and new not in state_dict:
                state_dict[new] = state_dict.pop(old)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, h_l: Tensor, c_l: Tensor, h_r: Tensor, c_r: Tensor) -> tuple[Tensor, Tensor]:
        """The state of an internal node (or a batch of them) from its two children's states.

        Arguments:
            h_l: the left child's ``h``, ``[..., hidden]``.
            c_l: the left child's ``c``, ``[..., hidden]``.
            h_r: the right child's ``h``, ``[..., hidden]``.
            c_r: the right child's ``c``, ``[..., hidden]``.

        Returns:
            ``(h, c)``, each ``[..., hidden]``.
        """
        return self.forward_cat(torch.cat([h_l, h_r], dim=-1), c_l, c_r)

    def forward_cat(self, h_lr: Tensor, c_l: Tensor, c_r: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`forward` with the children's ``h`` already concatenated, ``[h_l; h_r]``.

        Arguments:
            h_lr: ``[..., 2 * hidden]``.
            c_l: the left child's ``c``, ``[..., hidden]``.
            c_r: the right child's ``c``, ``[..., hidden]``.

        Returns:
            ``(h, c)``, each ``[..., hidden]``.
        """
        sig, u = self.node_gates(h_lr).split([4 * self.hidden, self.hidden], dim=-1)
        i, f_l, f_r, o = torch.sigmoid(sig).chunk(4, dim=-1)
        c = i * self.candidate_dropout(torch.tanh(u)) + f_l * c_l + f_r * c_r
        return o * torch.tanh(c), c


class TreeRNNCell(nn.Module):
    """The plain recursive network of Socher et al.: ``h = tanh(W [h_l; h_r] + b)``.

    Leaves compute ``h = tanh(W_leaf x + b_leaf)``. The state is the single vector ``h``, so
    :meth:`leaf` and :meth:`forward` return one tensor (there is no memory cell).

    Arguments:
        in_dim: the size of a leaf's input vector.
        hidden: the size of ``h``.

    Example:
        >>> cell = TreeRNNCell(4, 3)
        >>> h = cell(cell.leaf(torch.zeros(5, 4)), cell.leaf(torch.ones(5, 4)))
        >>> tuple(h.shape)
        (5, 3)
    """

    def __init__(self, in_dim: int, hidden: int) -> None:
        super().__init__()
        self.in_dim = in_dim
        self.hidden = hidden
        self.leaf_layer = nn.Linear(in_dim, hidden)
        self.node_layer = nn.Linear(2 * hidden, hidden)

    def leaf(self, x: Tensor) -> Tensor:
        """The state of a leaf (or a batch of leaves).

        Arguments:
            x: input, ``[..., in_dim]``.

        Returns:
            ``h``, ``[..., hidden]``.
        """
        return torch.tanh(self.leaf_layer(x))

    def forward(self, h_l: Tensor, h_r: Tensor) -> Tensor:
        """The state of an internal node (or a batch of them) from its two children's states.

        Arguments:
            h_l: the left child's state, ``[..., hidden]``.
            h_r: the right child's state, ``[..., hidden]``.

        Returns:
            ``h``, ``[..., hidden]``.
        """
        return torch.tanh(self.node_layer(torch.cat([h_l, h_r], dim=-1)))


class FoldBenchmarkCell(nn.Module):
    """The tree cell of TensorFlow Fold's ICLR 2017 benchmark: one state vector of size ``d``.

    Leaves look their state up in an embedding table. An internal node with children states
    ``l`` and ``r`` computes ``z = relu(W1 [l; r] + b1)``, splits ``W2 z + b2`` into
    ``f_l, f_r, i, g`` and returns
    ``sigmoid(f_l) * l + sigmoid(f_r) * r + sigmoid(i) * tanh(g)`` (no output gate).

    Arguments:
        vocab_size: the number of leaf word ids.
        d: the state size.

    Example:
        >>> cell = FoldBenchmarkCell(10, 8)
        >>> l, r = cell.leaf(torch.tensor([1, 2])), cell.leaf(torch.tensor([3, 4]))
        >>> tuple(cell(l, r).shape), tuple(cell(l[0], r[0]).shape)
        ((2, 8), (8,))
    """

    def __init__(self, vocab_size: int, d: int) -> None:
        super().__init__()
        self.d = d
        self.embedding = nn.Embedding(vocab_size, d)
        self.hidden_layer = nn.Linear(2 * d, d)
        self.gate_layer = nn.Linear(d, 4 * d)  # -> f_l, f_r, i, g

    def leaf(self, words: Tensor) -> Tensor:
        """The state of a leaf (or a batch of leaves): the embedding of its word id.

        Arguments:
            words: word ids, ``[...]`` (int64).

        Returns:
            ``[..., d]``.
        """
        return self.embedding(words)

    def forward(self, left: Tensor, right: Tensor) -> Tensor:
        """The state of an internal node (or a batch of them).

        Arguments:
            left: the left child's state, ``[..., d]``.
            right: the right child's state, ``[..., d]``.

        Returns:
            ``[..., d]``.
        """
        z = torch.relu(self.hidden_layer(torch.cat([left, right], dim=-1)))
        sig, g = self.gate_layer(z).split([3 * self.d, self.d], dim=-1)
        f_l, f_r, i = torch.sigmoid(sig).chunk(3, dim=-1)
        return f_l * left + f_r * right + i * torch.tanh(g)


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
