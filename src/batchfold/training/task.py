"""What the training loop needs from a job (SST sentiment, POS tagging, parsing)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from torch import Tensor, nn


class Task(Protocol):
    """One trainable job: its data, model, loss and evaluation.

    The loop (``batchfold.training.loop``) owns everything generic: optimizer, epochs,
    progress bars, checkpoints that resume, metrics JSON lines, the best checkpoint and the
    learning-curve plot. A task module provides ``add_arguments(parser)`` for its own options
    and ``make_task(args) -> Task``.
    """

    name: str
    """Short name used on the command line and in file names (``"sst"``)."""
    best_metric: str
    """Key of :meth:`evaluate`'s result on ``"dev"`` that picks the best checkpoint."""
    unit: str
    """What one training item is called in throughput figures (``"trees"``)."""

    def train_items(self) -> Sequence[Any]:
        """The training instances; the loop shuffles and batches them."""
        ...

    def build_model(self) -> nn.Module:
        """A freshly initialised model (the loop seeds the RNG first)."""
        ...

    def param_groups(self, model: nn.Module, lr: float) -> list[dict[str, Any]]:
        """Optimizer parameter groups (e.g. word vectors at a scaled learning rate)."""
        ...

    def loss(self, model: nn.Module, batch: Sequence[Any]) -> tuple[Tensor, int]:
        """The summed training loss of one batch and the number of terms it sums."""
        ...

    def evaluate(self, model: nn.Module, split: str) -> dict[str, float]:
        """Metrics on ``"dev"`` or ``"test"``, with the model in eval mode."""
        ...

