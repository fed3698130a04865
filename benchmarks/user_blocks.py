"""The binary Tree-LSTM as a user writes it in blocks, for the benchmarks.

``batchfold.models.tree_lstm_blocks`` is tuned: a leaf's lookup and cell are one
``Function``, and so are a node's output layer and loss, so that a tree node costs three
graph nodes. A user following Fold's examples writes a block per step instead: the word's
lookup, the leaf cell, the internal cell, the output layer and the loss each a ``Function``
of its own on the model's modules, reading the tree's fields with ``InputTransform``. Same
model, same weights, same loss; more nodes to record and schedule.
"""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import Tensor

from batchfold.blocks import (
    Block,
    Composition,
    ForwardDeclaration,
    Function,
    InputTransform,
    Metric,
    OneOf,
    PyObjectType,
    Record,
    Scalar,
    TensorType,
    TupleType,
)
from batchfold.models.tree_lstm import TreeLSTMClassifier


def user_tree_lstm_blocks(model: TreeLSTMClassifier) -> Block:
    """The classifier on one :class:`~batchfold.data.trees.BinaryTree` as a user's blocks:
    every node sends its cross-entropy to the metric ``"loss"``; the block gives the root's
    ``(h, c)``."""
    cell, dtype = model.cell, model.output.weight.dtype
    vector = TensorType((cell.hidden,), dtype)
    tree = ForwardDeclaration(PyObjectType(), TupleType(vector, vector), name="tree")

    def internal(left: tuple[Tensor, Tensor], right: tuple[Tensor, Tensor]) -> Any:
        return cell(left[0], left[1], right[0], right[1])

    def loss(logits: Tensor, labels: Tensor) -> Tensor:
        return F.cross_entropy(logits, labels, reduction="none")

    leaf = (
        InputTransform(lambda t: t.word, name="word")
        >> Scalar("int64")
        >> Function(model.embed, name="embed", modules=(model.embedding,))
        >> Function(cell.leaf, name="leaf", modules=(cell.leaf,))
    )
    children = InputTransform(lambda t: (t.left, t.right), name="children") >> Record(
        (tree(), tree())
    )
    node = children >> Function(internal, name="node", modules=(cell,))
    state = OneOf(lambda t: t.left is None, {True: leaf, False: node})
    output = Function(model, name="output", modules=(model,))
    label = InputTransform(lambda t: t.label, name="label") >> Scalar("int64")
    cross_entropy = Function(loss, name="loss")

    def wiring(t: Any) -> Any:
        h_c = state.reads(t)
        Metric("loss").reads(cross_entropy.reads(output.reads(h_c[0]), label.reads(t)))
        return h_c

    tree.resolve_to(Composition(wiring, PyObjectType(), name="tree_node"))
    return tree()
