"""The SST job: a Tree-LSTM (or Tree-RNN) classifying every node of Sentiment Treebank trees.

Each tree is plain single-instance code (:func:`tree_node_logits`: one cell call and one
output layer call per node) that ``batch_map`` records for a whole batch and runs batched,
or, with ``--front-end blocks``, the same model as blocks
(:func:`~batchfold.models.tree_lstm_blocks.tree_lstm_blocks`), which record faster;
the loss is the sum of the per-node cross-entropies, the same sum as
:func:`~batchfold.models.tree_lstm.tree_node_losses` gives. Word vectors start from GloVe
and train at a scaled learning rate, as in TensorFlow Fold's sentiment model. Metrics are the usual four SST accuracies (root and
all nodes, fine-grained and binary), in percent.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import batchfold as bf
from batchfold.blocks import CompiledModel
from batchfold.blocks import compile as compile_blocks
from batchfold.data.glove import word_vectors
from batchfold.data.sst import Tree, load_sst
from batchfold.data.trees import BinaryTree
from batchfold.data.vocab import Vocab
from batchfold.models.tree_lstm import TreeLSTMClassifier, TreeRNNClassifier, tree_node_logits
from batchfold.models.tree_lstm_blocks import tree_lstm_blocks
from batchfold.training.arguments import at_least_one
from batchfold.training.sst_metrics import (
    METRICS,
    N_CLASSES,
    binary_accuracy,
    sentiment_accuracies,
)

__all__ = [
    "METRICS",
    "SSTTask",
    "SentimentModel",
    "TreeRNNClassifier",  # defined in batchfold.models.tree_lstm; callers import it from here
    "add_arguments",
    "binary_accuracy",
    "make_task",
    "sentiment_accuracies",
    "to_binary_tree",
    "tree_node_logits",  # defined in batchfold.models.tree_lstm, as TreeRNNClassifier
]

SentimentModel = TreeLSTMClassifier | TreeRNNClassifier
"""A node classifier over binary trees: ``embed``, ``cell.leaf``, ``cell`` and ``forward``."""


def to_binary_tree(tree: Tree, vocab: Vocab, where: str = "tree") -> BinaryTree:
    """An SST tree with its words replaced by vocabulary ids, labels kept on every node.

    Arguments:
        tree: a parsed SST tree.
        vocab: the word ids (unknown words get id 0).
        where: names the tree in error messages, such as ``"train.txt line 12"``.

    Returns:
        The same tree as a :class:`~batchfold.data.trees.BinaryTree`.

    Raises:
        ValueError: a node has one child (the cells need binary trees).

    Example:
        >>> from batchfold.data.sst import parse_tree
        >>> to_binary_tree(parse_tree("(3 (2 a) (4 good))"), Vocab(["good", "a"]))
        BinaryTree('(3 (2 2) (4 1))')
    """
    built: list[BinaryTree] = []
    for node in tree.nodes():
        if node.word is not None:
            built.append(BinaryTree.leaf(vocab.lookup(node.word), node.label))
        elif len(node.children) == 2:
            right, left = built.pop(), built.pop()
            built.append(BinaryTree.node(left, right, node.label))
        else:
            raise ValueError(
                f"{where}: the node {node} has {len(node.children)} child; the tree cells need "
                "every internal node to have exactly 2 children"
            )
    return built[0]


def _node_labels(trees: Sequence[BinaryTree], device: torch.device) -> Tensor:
    """Every node's label, trees one after another, each in post-order: ``[n_nodes]``."""
    labels = [n.label for tree in trees for n in tree.nodes()]
    return torch.tensor(labels, dtype=torch.long, device=device)


# -- the task ---------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the SST options to ``parser`` and set the SST defaults of the loop's options.

    Arguments:
        parser: the ``batchfold train sst`` parser.
    """
    group = parser.add_argument_group("SST (Stanford Sentiment Treebank)")
    group.add_argument(
        "--data",
        default=None,
        metavar="DIR",
        help="folder with train.txt, dev.txt, test.txt (default: $BATCHFOLD_DATA/sst or "
        "shared/data/sst, else downloaded from Stanford)",
    )
    group.add_argument(
        "--glove",
        default=None,
        metavar="PATH",
        help="GloVe vectors, a file or a folder (default: the glove-sst data folder); "
        "'none' for random word vectors",
    )
    group.add_argument(
        "--word-dim",
        "--glove-dim",
        dest="word_dim",
        type=int,
        default=150,
        help="word vector size; picks the GloVe file glove.6B.<dim>d: 50 (vectors for 91.8%% of "
        "the SST words), 100 (the partial file: 89.9%%, no vectors for 'a', \"'s\", \"n't\" "
        "and other short tokens) or 150 (the 50d and 100d vectors side by side, the best on "
        "dev); words without a vector get the random initialisation (default: %(default)s)",
    )
    group.add_argument(
        "--cell",
        choices=("treelstm", "treernn"),
        default="treelstm",
        help="binary Tree-LSTM (Tai et al. 2015) or Tree-RNN (Socher et al.) (default: "
        "%(default)s)",
    )
    group.add_argument(
        "--hidden",
        type=int,
        default=300,
        help="cell state size (default: %(default)s, Fold's; Tai et al. used 150)",
    )
    group.add_argument(
        "--dropout",
        type=float,
        default=0.5,
        help="dropout on word vectors and on node states before the output layer "
        "(default: %(default)s; Fold used 0.25, keep probability 0.75)",
    )
    group.add_argument(
        "--recurrent-dropout",
        type=float,
        default=None,
        help="Tree-LSTM only: dropout on each cell's candidate, as in Fold's cell "
        "(default: 0.1 for the Tree-LSTM, 0 for the Tree-RNN; Fold used 0.25)",
    )
    group.add_argument(
        "--embed-lr-scale",
        type=float,
        default=2.0,
        help="the word vectors' learning rate as a fraction of --lr (default: %(default)s, "
        "as Tai et al.; Fold used 0.1)",
    )
    group.add_argument(
        "--front-end",
        choices=("lazy", "blocks"),
        default="lazy",
        help="lazy: per-tree PyTorch code run by batch_map; blocks: the same model as "
        "batchfold.blocks combinators (Tree-LSTM only); the same numbers without dropout "
        "(dropout draws one mask per instance with lazy, as eagerly, and one per step with "
        "blocks) (default: %(default)s)",
    )
    group.add_argument(
        "--eval-batch-size",
        type=at_least_one,
        default=1000,
        help="trees per batch_map call when evaluating (default: %(default)s)",
    )
    # Adagrad 0.05 as Fold's sentiment model; batch 25 as Tai et al. (Fold: 100). These
    # defaults, with hidden 300, dropout 0.5, recurrent dropout 0.1, GloVe 50d + 100d and 30
    # epochs of cosine decay, were chosen on dev root accuracy over three seeds
    # (results/README.md).
    parser.set_defaults(batch_size=25, epochs=30, lr_schedule="cosine")


def make_task(args: argparse.Namespace) -> SSTTask:
    """The SST task for the parsed options (data is read here).

    Arguments:
        args: the options of :func:`add_arguments` and of the training loop.

    Returns:
        The task.
    """
    return SSTTask(args)


class SSTTask:
    """Sentiment classification of every node of SST trees (see the module docstring).

    Arguments:
        args: the options of :func:`add_arguments` and of the training loop.

    Raises:
        FileNotFoundError: no SST data or no GloVe vectors (the message says where to get them).
        SSTFormatError: a malformed line in an SST file.
    """

    name = "sst"
    best_metric = "root_fine"
    unit = "trees"

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        if getattr(args, "front_end", "lazy") == "blocks" and args.cell != "treelstm":
            raise ValueError("--front-end blocks runs the Tree-LSTM only; use --cell treelstm")
        if getattr(args, "recurrent_dropout", 0.0) is None:  # the default: by cell type
            args.recurrent_dropout = 0.1 if args.cell == "treelstm" else 0.0
        try:
            raw = {split: load_sst(split, args.data) for split in ("train", "dev", "test")}
        except FileNotFoundError as err:
            raise FileNotFoundError(f"{err} On the command line: --data DIR.") from err
        self._compiled: tuple[TreeLSTMClassifier, CompiledModel] | None = None
        self.vocab = Vocab(
            word for trees in raw.values() for tree in trees for word in tree.words()
        )
        self.vectors = self._word_vectors()
        self.trees = {
            split: [
                to_binary_tree(tree, self.vocab, f"{split}.txt line {i}")
                for i, tree in enumerate(trees[: None if split == "train" else args.max_eval], 1)
            ]
            for split, trees in raw.items()
        }
        sizes = ", ".join(f"{len(trees)} {split}" for split, trees in self.trees.items())
        print(f"sst: {sizes} trees; {len(self.vocab)} words")

    def _word_vectors(self) -> Tensor:
        if self.args.glove is not None and str(self.args.glove).lower() == "none":
            generator = torch.Generator().manual_seed(self.args.seed)
            shape = (len(self.vocab), self.args.word_dim)
            return (torch.rand(shape, generator=generator) * 2 - 1) * 0.05
        try:
            vectors, found = word_vectors(
                self.vocab, self.args.glove, self.args.word_dim, seed=self.args.seed
            )
        except FileNotFoundError as err:
            raise FileNotFoundError(
                f"{err} On the command line: --glove PATH, or --glove none for random vectors."
            ) from err
        # Recorded in config.json as well as printed (the loop writes every option).
        self.args.glove_words = found
        return vectors

    def train_items(self) -> list[BinaryTree]:
        """The training trees, with word ids."""
        return self.trees["train"]

    def build_model(self) -> SentimentModel:
        """A fresh classifier whose word vectors are the loaded GloVe vectors."""
        args = self.args
        kind = TreeLSTMClassifier if args.cell == "treelstm" else TreeRNNClassifier
        model = kind(
            len(self.vocab),
            args.word_dim,
            args.hidden,
            N_CLASSES,
            args.dropout,
            getattr(args, "recurrent_dropout", 0.0),
        )
        with torch.no_grad():
            model.embedding.weight.copy_(self.vectors)
        return model

    def param_groups(self, model: nn.Module, lr: float) -> list[dict[str, Any]]:
        """The word vectors at ``lr * --embed-lr-scale`` and without ``--weight-decay`` (as Tai
        et al. regularise the other weights only: a penalty on every word vector at every step
        would pull the GloVe vectors of words a batch does not hold towards zero), every other
        parameter at ``lr``."""
        model = _sentiment_model(model)
        embedding = list(model.embedding.parameters())
        rest = [p for name, p in model.named_parameters() if not name.startswith("embedding.")]
        return [
            {"params": embedding, "lr": lr * self.args.embed_lr_scale, "weight_decay": 0.0},
            {"params": rest, "lr": lr},
        ]

    def _batched_logits(self, model: SentimentModel, trees: Sequence[BinaryTree]) -> Tensor:
        """The logits of every node of ``trees``, run as one batch: ``[n_nodes, 5]``."""
        if getattr(self.args, "front_end", "lazy") == "blocks":
            _, metrics = self._blocks(model)(list(trees))
            return metrics["logits"]
        leaf = bf.function(model.cell.leaf, batched=True)
        node = bf.function(model.cell, batched=True)
        per_tree = bf.batch_map(
            lambda tree: tree_node_logits(model, tree, leaf, node),
            trees,
            scheduler=self.args.scheduler,
        )
        return torch.stack([z for logits in per_tree for z in logits])

    def _blocks(self, model: SentimentModel) -> CompiledModel:
        """``model`` as compiled blocks that share its weights (kept for the last model)."""
        if not isinstance(model, TreeLSTMClassifier):
            raise ValueError("--front-end blocks runs the Tree-LSTM only; use --cell treelstm")
        if self._compiled is None or self._compiled[0] is not model:
            blocks = compile_blocks(tree_lstm_blocks(model), scheduler=self.args.scheduler)
            self._compiled = (model, blocks)
        return self._compiled[1]

    def loss(self, model: nn.Module, batch: Sequence[BinaryTree]) -> tuple[Tensor, int]:
        """The summed cross-entropy of every node of the batch, and the number of nodes."""
        # One cross_entropy over all nodes, rather than one per node inside batch_map as in
        # tree_node_losses: the same sum, with fewer than half the nodes to record.
        logits = self._batched_logits(_sentiment_model(model), batch)
        labels = _node_labels(batch, logits.device)
        return F.cross_entropy(logits, labels, reduction="sum"), len(labels)

    def eager_loss(self, model: nn.Module, batch: Sequence[BinaryTree]) -> tuple[Tensor, int]:
        """:meth:`loss` computed one tree and one node at a time in plain PyTorch."""
        model = _sentiment_model(model)
        total, terms = torch.zeros((), device=model.output.weight.device), 0
        for tree in batch:
            logits = torch.stack(tree_node_logits(model, tree))
            labels = _node_labels([tree], logits.device)
            total = total + F.cross_entropy(logits, labels, reduction="sum")
            terms += len(labels)
        return total, terms

    def evaluate(self, model: nn.Module, split: str) -> dict[str, float]:
        """The four accuracies (:data:`METRICS`, percent) on ``"dev"`` or ``"test"``."""
        if split not in ("dev", "test"):
            raise ValueError(f"SST evaluates on 'dev' or 'test', got {split!r}")
        model = _sentiment_model(model)
        trees = self.trees[split]
        size = self.args.eval_batch_size
        if not trees or size < 1:
            raise ValueError(
                f"SST {split}: nothing to evaluate ({len(trees)} trees, --eval-batch-size {size})"
            )
        with torch.no_grad():
            probs = torch.cat(
                [
                    self._batched_logits(model, trees[i : i + size]).softmax(dim=-1)
                    for i in range(0, len(trees), size)
                ]
            )
        labels = _node_labels(trees, probs.device)
        ends = torch.tensor([tree.size for tree in trees], device=probs.device).cumsum(0) - 1
        is_root = torch.zeros(len(labels), dtype=torch.bool, device=probs.device)
        is_root[ends] = True
        return sentiment_accuracies(probs, labels, is_root)


def _sentiment_model(model: nn.Module) -> SentimentModel:
    if not isinstance(model, (TreeLSTMClassifier, TreeRNNClassifier)):
        raise TypeError(
            f"the SST task runs a TreeLSTMClassifier or TreeRNNClassifier, got "
            f"{type(model).__name__}"
        )
    return model
