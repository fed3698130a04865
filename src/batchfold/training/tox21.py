"""The ``tox21`` job: Weave graph convolutions on 12 toxicity assays (``batchfold train tox21``).

Tox21 (part of MoleculeNet) labels 7,831 molecules active or inactive in 12 assays, 17 %
of the labels missing. The model gives 12 logits per molecule; the loss is the binary
cross-entropy of the measured labels only (:func:`masked_bce`), and the metric is the ROC-AUC
of each assay over the molecules measured in it, averaged over the assays
(:func:`mean_roc_auc`, ``roc_auc``, which picks the best checkpoint). Data, split, model
and front-end options are :func:`~batchfold.training.molecules.add_molecule_arguments`'.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from batchfold.data.molecules import TOX21_TASKS, Molecule, load_tox21
from batchfold.training.molecules import MoleculeTask, labels_of

__all__ = ["Tox21Task", "add_arguments", "make_task", "masked_bce", "mean_roc_auc", "roc_auc"]


def masked_bce(logits: Tensor, labels: Tensor, mask: Tensor) -> tuple[Tensor, int]:
    """The summed binary cross-entropy of the measured labels, and how many there are.

    Arguments:
        logits: ``[n, tasks]``.
        labels: 0 or 1, ``[n, tasks]``; any value where ``mask`` is False.
        mask: ``[n, tasks]`` bool, True where the label was measured.

    Returns:
        ``(loss, count)``; a missing label adds nothing to either, nor to the gradient.

    Example:
        >>> logits = torch.tensor([[0.0, 5.0]])
        >>> loss, n = masked_bce(logits, torch.tensor([[1.0, 0.0]]), torch.tensor([[True, False]]))
        >>> round(loss.item(), 4), n
        (0.6931, 1)
    """
    if not (logits.shape == labels.shape == mask.shape):
        raise ValueError(
            f"expected logits, labels and mask of one shape, got {list(logits.shape)}, "
            f"{list(labels.shape)} and {list(mask.shape)}"
        )
    terms = F.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype), reduction="none")
    return torch.where(mask, terms, torch.zeros_like(terms)).sum(), int(mask.sum())


def roc_auc(scores: Tensor, labels: Tensor) -> float:
    """The area under the ROC curve: how often a positive outscores a negative (ties half).

    Computed from ranks (the Mann-Whitney U statistic), tied scores sharing their mean rank.

    Arguments:
        scores: ``[n]``, higher meaning more likely positive.
        labels: ``[n]``, 0 or 1 (or bool).

    Returns:
        The AUC in [0, 1], or NaN when the labels are all of one class.

    Example:
        >>> roc_auc(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0, 0, 1, 1]))
        0.75
    """
    if scores.dim() != 1 or scores.shape != labels.shape:
        raise ValueError(
            f"expected scores and labels of one shape [n], got {list(scores.shape)} and "
            f"{list(labels.shape)}"
        )
    positive = labels.bool()
    n_pos = int(positive.sum())
    n_neg = len(labels) - n_pos
    if n_pos == 0 or n_neg == 0:
        return math.nan
    order = scores.double().argsort()
    _, group, counts = torch.unique_consecutive(
        scores.double()[order], return_inverse=True, return_counts=True
    )
    mean_rank = counts.cumsum(0).double() - (counts.double() - 1) / 2  # ranks from 1
    ranks = torch.empty(len(scores), dtype=torch.float64, device=scores.device)
    ranks[order] = mean_rank[group]
    u = ranks[positive].sum().item() - n_pos * (n_pos + 1) / 2
    return u / (n_pos * n_neg)


def mean_roc_auc(scores: Tensor, labels: Tensor, mask: Tensor) -> float:
    """The ROC-AUC of each task over its measured labels, averaged over tasks.

    A task whose measured labels are all of one class has no AUC and is left out.

    Arguments:
        scores: ``[n, tasks]``.
        labels: ``[n, tasks]``, 0 or 1.
        mask: ``[n, tasks]`` bool, True where the label was measured.

    Returns:
        The mean AUC.

    Raises:
        ValueError: no task has both classes among the measured labels (too few molecules
            evaluated): the mean is undefined, and a NaN would pass as a metric.

    Example:
        >>> scores = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.5, 0.3]])
        >>> labels = torch.tensor([[1, 0], [0, 1], [0, 1]])
        >>> mask = torch.tensor([[True, True], [True, True], [True, False]])
        >>> mean_roc_auc(scores, labels, mask)
        1.0
    """
    aucs = [roc_auc(scores[mask[:, t], t], labels[mask[:, t], t]) for t in range(scores.shape[1])]
    valid = [auc for auc in aucs if not math.isnan(auc)]
    if not valid:
        raise ValueError(
            f"ROC-AUC of {scores.shape[0]} molecules: no task has both classes among its "
            "measured labels, so no task has an AUC; evaluate more molecules (--max-eval)"
        )
    return sum(valid) / len(valid)


class Tox21Task(MoleculeTask):
    """Toxicity classification on Tox21's 12 assays with a Weave model (see the module docstring).

    Arguments:
        args: the options of :func:`add_arguments` and of the training loop.

    Raises:
        FileNotFoundError: no Tox21 file (the message says where to get it).
        MoleculeFormatError: a malformed row.
    """

    name = "tox21"
    best_metric = "roc_auc"
    n_tasks = len(TOX21_TASKS)
    title = "Tox21 (12 toxicity assays, MoleculeNet)"
    data_help = (
        "tox21.csv (or .csv.gz) or its folder (default: $BATCHFOLD_DATA/moleculenet or "
        "shared/data/moleculenet)"
    )
    epochs = 20

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args, load_tox21)

    def batch_loss(self, outputs: Tensor, molecules: Sequence[Molecule]) -> tuple[Tensor, int]:
        """The summed cross-entropy of the measured labels, and their number."""
        labels, mask = labels_of(molecules, outputs.device)
        return masked_bce(outputs, labels, mask)

    def metrics(self, outputs: Tensor, molecules: Sequence[Molecule]) -> dict[str, float]:
        """The mean ROC-AUC over the assays."""
        labels, mask = labels_of(molecules, outputs.device)
        return {"roc_auc": mean_roc_auc(outputs, labels, mask)}


add_arguments = Tox21Task.add_arguments
make_task = Tox21Task  # the task for the parsed options (the data is read and featurized here)
