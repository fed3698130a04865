"""Binary tree cells: Tree-LSTM, Tree-RNN, and the cell of TensorFlow Fold's benchmark.

A cell gives the state of a leaf from its input, and that of an internal node from its two
children's states. The cells work on one instance (``x`` of shape ``[in]``, ``h`` of shape
``[hidden]``) and on a batch (a leading dimension ``[n, ...]``) alike: they only use
``nn.Linear``, element-wise functions and ``dim=-1`` splits, with no branching on values.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

__all__ = [
    "BinaryTreeLSTMCell",
    "FoldBenchmarkCell",
    "TreeLSTMLeaf",
    "TreeRNNCell",
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
