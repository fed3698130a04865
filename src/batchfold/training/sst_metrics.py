"""The SST accuracies: root and all-node, fine-grained (five classes) and binary, in percent.

Binary accuracy leaves neutral nodes out and compares the probability mass on the positive
classes with that on the negative ones.
"""

from __future__ import annotations

from torch import Tensor

__all__ = [
    "METRICS",
    "binary_accuracy",
    "sentiment_accuracies",
]

METRICS = ("root_fine", "root_binary", "all_fine", "all_binary")
"""The accuracies :meth:`~batchfold.training.sst.SSTTask.evaluate` reports, in percent."""

N_CLASSES = 5
NEUTRAL = 2


def binary_accuracy(probs: Tensor, labels: Tensor) -> float:
    """Binary sentiment accuracy in percent, ignoring neutral labels.

    A node with gold label 0 or 1 is negative, 3 or 4 positive, 2 is left out. The predicted
    side is positive when ``P(3) + P(4) > P(0) + P(1)`` (so a tie counts as negative).

    Arguments:
        probs: class probabilities, ``[n, 5]``.
        labels: gold labels 0-4, ``[n]``.

    Returns:
        The percentage of non-neutral nodes on the right side, or NaN when all are neutral.

    Example:
        >>> import torch
        >>> probs = torch.tensor([[0.1, 0.1, 0.5, 0.2, 0.1],   # 0.3 > 0.2: positive
        ...                       [0.3, 0.0, 0.5, 0.1, 0.1],   # 0.2 < 0.3: negative
        ...                       [0.0, 0.0, 1.0, 0.0, 0.0]])  # gold neutral: left out
        >>> binary_accuracy(probs, torch.tensor([4, 3, 2]))
        50.0
    """
    if probs.dim() != 2 or probs.shape[1] != N_CLASSES or labels.shape != probs.shape[:1]:
        raise ValueError(
            f"binary_accuracy expects probs [n, {N_CLASSES}] and labels [n], got "
            f"{list(probs.shape)} and {list(labels.shape)}"
        )
    counted = labels != NEUTRAL
    if not bool(counted.any()):
        return float("nan")
    positive = probs[:, 3] + probs[:, 4] > probs[:, 0] + probs[:, 1]
    correct = positive[counted] == (labels[counted] > NEUTRAL)
    return 100.0 * correct.double().mean().item()


def sentiment_accuracies(probs: Tensor, labels: Tensor, is_root: Tensor) -> dict[str, float]:
    """The four SST accuracies, in percent: root and all-node, fine-grained and binary.

    Arguments:
        probs: class probabilities of every node, ``[n, 5]``.
        labels: gold labels, ``[n]``.
        is_root: which nodes are sentence roots, ``[n]`` (bool).

    Returns:
        ``root_fine``, ``root_binary``, ``all_fine`` and ``all_binary``.

    Example:
        >>> import torch
        >>> probs = torch.eye(5)[[4, 1, 3]]
        >>> acc = sentiment_accuracies(probs, torch.tensor([4, 0, 1]),
        ...                            torch.tensor([True, False, False]))
        >>> [round(acc[k], 1) for k in METRICS]
        [100.0, 100.0, 33.3, 66.7]
    """
    fine = probs.argmax(dim=-1) == labels
    return {
        "root_fine": 100.0 * fine[is_root].double().mean().item(),
        "root_binary": binary_accuracy(probs[is_root], labels[is_root]),
        "all_fine": 100.0 * fine.double().mean().item(),
        "all_binary": binary_accuracy(probs, labels),
    }
