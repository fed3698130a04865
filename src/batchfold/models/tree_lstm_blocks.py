"""The sentiment Tree-LSTM of :mod:`batchfold.models.tree_lstm` written as blocks.

Recursion goes through a ``ForwardDeclaration``, leaves and internal nodes are the two cases
of a ``OneOf`` on the node's number of children, and every node sends its logits (with its
label) and its cross-entropy to two ``Metric`` s. The blocks reuse the classifier's modules,
so the block model and :func:`~batchfold.models.tree_lstm.tree_node_losses` share weights.

Inputs are SST trees (:class:`batchfold.data.sst.Tree`, words as strings, looked up in a
vocabulary) or :class:`batchfold.data.trees.BinaryTree` (word ids).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from batchfold.blocks import (
    Block,
    Composition,
    ForwardDeclaration,
    Function,
    GetItem,
    InputTransform,
    Metric,
    OneOf,
    PyObjectType,
    Record,
    Scalar,
    TensorType,
    TupleType,
)
from batchfold.data.sst import Tree
from batchfold.data.trees import BinaryTree
from batchfold.models.tree_lstm import TreeLSTMClassifier

__all__ = ["node_view", "tree_lstm_blocks"]

NodeView = tuple[int, Any, int, tuple[Any, ...]]


def node_view(node: Tree | BinaryTree) -> NodeView:
    """``(number of children, word, label, children)`` of an SST or a binary tree node.

    Example:
        >>> node_view(BinaryTree.leaf(7, label=3))
        (0, 7, 3, ())
    """
    if isinstance(node, Tree):
        return (len(node.children), node.word, node.label, node.children)
    if isinstance(node, BinaryTree):
        if node.left is None or node.right is None:
            return (0, node.word, node.label, ())
        return (2, None, node.label, (node.left, node.right))
    raise TypeError(f"expected an SST Tree or a BinaryTree node, got {type(node).__name__}")


def tree_lstm_blocks(
    model: TreeLSTMClassifier, word_id: Callable[[str], int] | None = None
) -> Block:
    """The classifier as a block on one tree: it gives the root's logits.

    Every node sends its logits, labelled with its gold label, to the metric ``"logits"``
    and its cross-entropy to ``"loss"`` (``metrics["loss"].sum()`` is the training loss of
    the batch, as :func:`~batchfold.models.tree_lstm.tree_node_losses` sums it).

    Arguments:
        model: the classifier whose embedding, cell, dropout and output layer to use.
        word_id: maps an SST word to its id (e.g. a ``Vocab``'s ``__getitem__``); needed
            for SST trees, whose leaves hold strings.

    Returns:
        The root block; compile it with ``batchfold.blocks.compile``.

    Example:
        >>> import torch
        >>> from batchfold.blocks import compile
        >>> from batchfold.data.trees import random_trees
        >>> _ = torch.manual_seed(0)
        >>> classifier = TreeLSTMClassifier(100, emb_dim=6, hidden=4)
        >>> blocks = compile(tree_lstm_blocks(classifier))
        >>> logits, metrics = blocks(random_trees(3, 2, 5, vocab_size=100))
        >>> tuple(logits.shape), metrics["loss"].shape == metrics["logits"].shape[:1]
        ((3, 5), True)
    """
    hidden = model.cell.hidden
    dtype = model.output.weight.dtype
    vector = TensorType((hidden,), dtype)
    logits_type = TensorType((model.output.out_features,), dtype)
    tree = ForwardDeclaration(
        PyObjectType(), TupleType(TupleType(vector, vector), logits_type), name="tree"
    )

    def lookup(word: Any) -> int:
        if isinstance(word, int):
            return word
        if word_id is None:
            raise ValueError(f"the leaf word {word!r} needs word_id to map it to an id")
        return word_id(word)

    # one graph node per leaf and one per output: fewer nodes to record and schedule; the
    # model's bound methods, so that train/eval, a copy and its weights are the model's
    leaf = (
        GetItem(1)
        >> InputTransform(lookup, name="word_id")
        >> Scalar("int64")
        >> Function(model.leaf_state, name="tree_lstm_leaf")
    )
    children = Record((tree() >> GetItem(0), tree() >> GetItem(0)))
    internal = GetItem(3) >> children >> Function(model.node_state, name="tree_lstm_node")
    state = OneOf(lambda view: view[0], {0: leaf, 2: internal})
    output = Function(model.logits_and_loss, name="output_and_loss")
    label = GetItem(2) >> Scalar("int64")

    def wiring(x: Any) -> Any:
        view = InputTransform(node_view).reads(x)
        h_c = state.reads(view)
        logits_loss = output.reads(h_c[0], label.reads(view))
        Metric("logits").reads(logits_loss[0], view[2])
        Metric("loss").reads(logits_loss[1])
        return h_c, logits_loss[0]

    tree.resolve_to(Composition(wiring, PyObjectType(), name="tree_node"))
    return tree() >> GetItem(1)
