"""What an arc-hybrid configuration is scored from, and what its scores mean.

:class:`~batchfold.models.parser.ArcHybridParser` scores a configuration from the vectors of
the tokens :func:`feature_positions` names. Its scores are one per transition (SHIFT,
LEFT_ARC, RIGHT_ARC), then one per relation for each arc direction (:func:`score_layout`);
:func:`best_transition` reads the greedy decision from them, and :func:`transition_loss` is
the cross-entropy of a target transition and relation.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from batchfold.data.conllu import ROOT
from batchfold.models.transitions import Action, ArcHybrid

__all__ = [
    "best_transition",
    "feature_positions",
    "score_layout",
    "transition_loss",
]

N_FEATURES = 4
"""Positions read per configuration: stack items 3, 2 and 1 (the top), then the buffer front."""


def feature_positions(config: ArcHybrid) -> list[int | None]:
    """The tokens a configuration is scored from, as positions in ``ArcHybridParser.encode``.

    The top three stack items, deepest first (``None`` where the stack is shorter), then the
    first buffer item; words ``1..n`` are at ``0..n-1`` and the root at ``n``, as in
    :meth:`~batchfold.models.parser.ArcHybridParser.encode`.

    Example:
        >>> c = ArcHybrid(2); c.apply(Action.SHIFT)
        >>> feature_positions(c)
        [None, None, 0, 1]
    """
    stack, n = config.stack, config.n_words

    def position(item: int) -> int:
        return n if item == ROOT else item - 1

    items = [position(stack[-k]) if len(stack) >= k else None for k in (3, 2, 1)]
    return [*items, position(config.b0)]


def score_layout(n_labels: int) -> dict[str, slice]:
    """Where the transitions' and the relations' scores sit in a configuration's scores.

    Arguments:
        n_labels: the number of relations.

    Returns:
        ``"transitions"``: SHIFT, LEFT_ARC, RIGHT_ARC (in :class:`Action` order);
        ``"LEFT_ARC"`` and ``"RIGHT_ARC"``: one score per relation id for that arc.

    Example:
        >>> score_layout(2)  # doctest: +NORMALIZE_WHITESPACE
        {'transitions': slice(0, 3, None), 'LEFT_ARC': slice(3, 5, None),
         'RIGHT_ARC': slice(5, 7, None)}
    """
    n = len(Action)
    return {
        "transitions": slice(0, n),
        "LEFT_ARC": slice(n, n + n_labels),
        "RIGHT_ARC": slice(n + n_labels, n + 2 * n_labels),
    }


def _argmax(values: Sequence[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)  # the first best, as torch.argmax


def best_transition(
    scores: Sequence[float], config: ArcHybrid, n_labels: int
) -> tuple[Action, int | None]:
    """The best-scoring legal transition and, for an arc, its best relation id.

    Ties go to the earlier transition (SHIFT, LEFT_ARC, RIGHT_ARC) and the lower relation id.

    Arguments:
        scores: a configuration's scores, laid out as in :func:`score_layout`.
        config: the configuration (not terminal).
        n_labels: the number of relations.

    Returns:
        ``(action, label)``; the label is ``None`` for SHIFT.

    Raises:
        ValueError: the configuration is terminal.

    Example:
        >>> c = ArcHybrid(2); c.apply(Action.SHIFT)
        >>> best_transition([0.0, 1.0, 9.0, 5.0, 6.0, 0.0, 0.0], c, 2)  # no RIGHT_ARC yet
        (<Action.LEFT_ARC: 1>, 1)
    """
    legal = config.legal_actions()
    if not legal:
        raise ValueError(f"expected a configuration with a legal transition, found {config!r}")
    action = max(legal, key=lambda a: scores[a])  # max keeps the first of equal scores
    if action is Action.SHIFT:
        return action, None
    return action, _argmax(scores[score_layout(n_labels)[action.name]])


def transition_loss(scores: Tensor, targets: Tensor) -> Tensor:
    """Cross-entropy of the transition plus, for an arc, of its relation given the direction.

    Written for a batch: the relation's softmax runs over the relations of the target
    transition's direction only.

    Arguments:
        scores: ``[batch, n_scores]``, laid out as in :func:`score_layout`.
        targets: ``[batch, 2]`` (int64): the transition (an :class:`Action` value) and the
            relation id, or -100 (no relation: SHIFT, or an arc whose relation is free).

    Returns:
        ``[batch]`` losses.

    Example:
        >>> scores = torch.zeros(2, 7)  # 3 transitions, 2 relations per direction
        >>> loss = transition_loss(scores, torch.tensor([[0, -100], [2, 1]]))
        >>> torch.allclose(loss, torch.log(torch.tensor([3.0, 6.0])))
        True
    """
    n = len(Action)
    n_labels = (scores.shape[-1] - n) // 2
    action_loss = F.cross_entropy(scores[:, :n], targets[:, 0], reduction="none")
    by_direction = scores[:, n:].unflatten(-1, (2, n_labels))  # [batch, LEFT/RIGHT, labels]
    direction = (targets[:, 0] - int(Action.LEFT_ARC)).clamp(min=0)  # SHIFT rows: ignored
    rows = by_direction[torch.arange(len(scores), device=scores.device), direction]
    label_loss = F.cross_entropy(rows, targets[:, 1], ignore_index=-100, reduction="none")
    return action_loss + label_loss
