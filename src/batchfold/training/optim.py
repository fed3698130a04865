"""The optimizer of a training run and its learning-rate schedule, from the command-line options.

:func:`make_optimizer` builds ``--optimizer`` over a task's parameter groups;
:func:`set_epoch_lr` sets every group's rate for an epoch from ``--lr-schedule``: ``constant``
(the rate of the group throughout) or ``cosine`` (each group's rate decays along half a cosine
from its own rate at epoch 1 to ``--min-lr-scale`` times it at the last epoch). The rate is a
function of the epoch alone, so a resumed run gets exactly the rates it would have had.
:func:`make_average` keeps ``--ema``'s moving average of the weights.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim.swa_utils import AveragedModel

from batchfold.errors import ConfigError
from batchfold.training.arguments import DEFAULT_LR, LR_SCHEDULES

__all__ = ["epoch_lr_scale", "make_average", "make_optimizer", "set_epoch_lr"]


def make_optimizer(
    name: str, groups: list[dict[str, Any]], lr: float, weight_decay: float = 0.0
) -> torch.optim.Optimizer:
    """The optimizer ``name`` over parameter ``groups`` (each may carry its own ``lr``).

    Arguments:
        name: ``"adagrad"`` (its accumulator starts at 0.1, as TensorFlow's) or ``"adam"``.
        groups: parameter groups, as ``torch.optim`` takes them.
        lr: the rate of groups that set none.
        weight_decay: the L2 penalty added to the gradients (0: none).

    Raises:
        ConfigError: an unknown optimizer, or a negative weight decay.

    Example:
        >>> opt = make_optimizer("adam", [{"params": [torch.zeros(2, requires_grad=True)]}], 0.1)
        >>> type(opt).__name__, opt.param_groups[0]["lr"]
        ('Adam', 0.1)
    """
    if weight_decay < 0:
        raise ConfigError(f"--weight-decay must be at least 0, got {weight_decay}")
    if name == "adagrad":
        # TensorFlow's starting accumulator (Fold's sentiment model): the first steps are not
        # full lr-sized sign steps on every weight, as they are when it starts at 0.
        return torch.optim.Adagrad(
            groups, lr=lr, initial_accumulator_value=0.1, weight_decay=weight_decay
        )
    if name == "adam":
        return torch.optim.Adam(groups, lr=lr, weight_decay=weight_decay)
    raise ConfigError(f"unknown optimizer {name!r}; expected one of {sorted(DEFAULT_LR)}")


def epoch_lr_scale(schedule: str, epoch: int, epochs: int, min_scale: float = 0.0) -> float:
    """The factor on every group's rate in ``epoch`` (from 1) of ``epochs``.

    Arguments:
        schedule: ``"constant"`` or ``"cosine"``.
        epoch: the epoch, from 1.
        epochs: the run's number of epochs.
        min_scale: the cosine schedule's factor at the last epoch.

    Raises:
        ConfigError: an unknown schedule, or ``min_scale`` outside [0, 1].

    Example:
        >>> [round(epoch_lr_scale("cosine", e, 5), 3) for e in range(1, 6)]
        [1.0, 0.854, 0.5, 0.146, 0.0]
        >>> epoch_lr_scale("constant", 3, 5)
        1.0
    """
    if schedule not in LR_SCHEDULES:
        raise ConfigError(f"unknown --lr-schedule {schedule!r}; expected one of {LR_SCHEDULES}")
    if not 0.0 <= min_scale <= 1.0:
        raise ConfigError(f"--min-lr-scale must be in [0, 1], got {min_scale}")
    if schedule == "constant" or epochs <= 1:
        return 1.0
    progress = (epoch - 1) / (epochs - 1)
    return min_scale + (1.0 - min_scale) * 0.5 * (1.0 + math.cos(math.pi * progress))


def set_epoch_lr(
    optimizer: torch.optim.Optimizer,
    schedule: str,
    epoch: int,
    epochs: int,
    min_scale: float = 0.0,
) -> float:
    """Set every parameter group's rate for ``epoch``: its first rate times the schedule's factor.

    A group's first rate is kept in its ``"initial_lr"`` entry (as ``torch.optim.lr_scheduler``
    keeps it), so it survives in the optimizer's ``state_dict`` and a resumed run.

    Returns:
        The factor applied.

    Example:
        >>> opt = make_optimizer("adam", [{"params": [torch.zeros(1, requires_grad=True)]}], 0.1)
        >>> set_epoch_lr(opt, "cosine", 3, 5), opt.param_groups[0]["lr"]
        (0.5, 0.05)
    """
    scale = epoch_lr_scale(schedule, epoch, epochs, min_scale)
    for group in optimizer.param_groups:
        group.setdefault("initial_lr", group["lr"])
        group["lr"] = group["initial_lr"] * scale
    return scale


def make_average(model: nn.Module, decay: float) -> AveragedModel | None:
    """An exponential moving average of ``model``'s weights and buffers, or ``None`` for 0.

    After each optimizer step, ``average.update_parameters(model)`` moves every floating
    weight and buffer by ``1 - decay`` toward the model's (the first update copies them);
    buffers of other dtypes (BatchNorm's count of batches) are the model's own, not an
    average truncated to an integer. ``average.module`` is a model of the same class that
    holds the average.

    Arguments:
        model: the model being trained.
        decay: the share of the old average kept at each update, in [0, 1); 0: no average.

    Raises:
        ConfigError: ``decay`` outside [0, 1).

    Example:
        >>> model = nn.Linear(1, 1, bias=False)
        >>> average = make_average(model, 0.5)
        >>> for w in (2.0, 4.0):
        ...     _ = model.weight.data.fill_(w)
        ...     average.update_parameters(model)
        >>> average.module.weight.item()
        3.0
    """
    if not 0.0 <= decay < 1.0:
        raise ConfigError(f"--ema must be in [0, 1), got {decay}")
    if decay == 0.0:
        return None
    return AveragedModel(model, multi_avg_fn=_ema_update(decay), use_buffers=True)


def _ema_update(decay: float) -> Callable[[Sequence[Tensor], Sequence[Tensor], Any], None]:
    """``AveragedModel``'s update of tensors of one device and dtype (it groups them so)."""

    @torch.no_grad()
    def update(averaged: Sequence[Tensor], current: Sequence[Tensor], _: Any) -> None:
        if averaged[0].is_floating_point() or averaged[0].is_complex():
            torch._foreach_lerp_(list(averaged), list(current), 1 - decay)
        else:  # a count, say: the model's own
            for a, c in zip(averaged, current, strict=True):
                a.copy_(c)

    return update
