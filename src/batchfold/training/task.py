"""What the training loop needs from a job (SST sentiment, tagging, parsing, molecules)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from torch import Tensor, nn


class Task(Protocol):
    """One trainable job: its data, model, loss and evaluation.

    The loop (``batchfold.training.loop``) owns everything generic: optimizer, epochs,
    progress bars, checkpoints that resume, metrics JSON lines, the best checkpoint and the
    learning-curve plot. A task module provides ``add_arguments(parser)`` for its own options
    and ``make_task(args) -> Task``.

    ``make_task`` also receives the loop's options; a task reads ``args.device``,
    ``args.scheduler`` (for ``batch_map``), ``args.max_eval`` (evaluate on the first N
    items of a split, ``None`` for all) and ``args.seed`` from there. ``add_arguments`` may
    change the loop's defaults with ``parser.set_defaults(batch_size=..., epochs=...,
    lr=...)``.
    """

    name: str
    """Short name used on the command line and in file names (``"sst"``)."""
    best_metric: str
    """Key of :meth:`evaluate`'s result on ``"dev"`` that picks the best checkpoint (higher
    is better, unless the task has a true ``lower_is_better`` attribute, as an error does)."""
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


@runtime_checkable
class EagerBaseline(Protocol):
    """A task that can also compute its loss one item at a time in plain PyTorch.

    The loop times :meth:`eager_loss` against :meth:`Task.loss` on the same batches and
    weights once per run, and reports the speedup of batching.
    """

    def eager_loss(self, model: nn.Module, batch: Sequence[Any]) -> tuple[Tensor, int]:
        """:meth:`Task.loss` computed item by item, op by op, without ``batch_map``."""
        ...
