"""What the ``esol`` and ``tox21`` jobs share: molecule data, splits, options and the Weave model.

:func:`add_molecule_arguments` adds the data, split, model and front-end options;
:class:`MoleculeTask` reads a data set, splits it (random 80/10/10 with a seed, or
Bemis-Murcko scaffolds), builds a :class:`~batchfold.models.weave.WeaveModel` and predicts
a batch of molecules with either front end: ``lazy`` (the default,
:func:`~batchfold.models.weave.weave_predict` through ``batchfold.batch_map``, one node per
molecule) or ``blocks`` (:func:`~batchfold.models.weave_blocks.weave_blocks`), or one
molecule at a time in plain PyTorch (the loop's eager baseline). A subclass gives the loss
and the metrics: :mod:`batchfold.training.esol` (regression, RMSE) and
:mod:`batchfold.training.tox21` (12 binary tasks, mean ROC-AUC).
"""

from __future__ import annotations

import abc
import argparse
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

import batchfold as bf
from batchfold.blocks import CompiledModel
from batchfold.blocks import compile as compile_blocks
from batchfold.data.molecules import (
    ATOM_COUNT_FEATURES,
    ATOM_FEATURES,
    Molecule,
    MoleculeSet,
    SkippedMoleculeWarning,
    random_split,
    scaffold_split,
)
from batchfold.models.weave import WeaveModel, weave_predict
from batchfold.models.weave_blocks import weave_blocks
from batchfold.training.arguments import at_least_one

__all__ = ["MoleculeTask", "add_molecule_arguments", "expect_weave", "labels_of"]

SPLITS = ("train", "dev", "test")
FRACTIONS = (0.8, 0.1, 0.1)


def add_molecule_arguments(parser: argparse.ArgumentParser, title: str, data_help: str) -> None:
    """Add the options shared by the molecule jobs to ``parser``, and their loop defaults.

    The split option is ``--splitter`` (DeepChem's word for it): ``--split`` is taken by
    ``batchfold eval``, which picks the split to evaluate.

    Arguments:
        parser: the ``batchfold train esol`` (or ``tox21``) parser.
        title: the option group's title.
        data_help: what ``--data`` defaults to.
    """
    group = parser.add_argument_group(title)
    group.add_argument("--data", default=None, metavar="PATH", help=data_help)
    group.add_argument(
        "--splitter",
        choices=("random", "scaffold"),
        default="random",
        help="random: a seeded shuffle cut 80/10/10; scaffold: molecules grouped by "
        "Bemis-Murcko scaffold, largest groups to train (default: %(default)s)",
    )
    group.add_argument(
        "--split-seed",
        type=int,
        default=0,
        help="seed of the random split, apart from --seed so runs can share a split "
        "(default: %(default)s)",
    )
    group.add_argument(
        "--max-pair-distance",
        type=int,
        default=None,
        metavar="D",
        help="keep only atom pairs at most D bonds apart (default: every pair, as in "
        "Kearnes et al.)",
    )
    group.add_argument(
        "--front-end",
        choices=("blocks", "lazy"),
        default="lazy",
        help="lazy: per-molecule PyTorch code run by batch_map, one node per molecule; "
        "blocks: the Weave model as batchfold.blocks over atom and pair records, 5-7x "
        "slower; the same numbers without dropout (dropout draws one mask per instance with "
        "lazy, as eagerly, and one per step with blocks) (default: %(default)s)",
    )
    group.add_argument(
        "--atom-counts",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="add each atom's degree and hydrogen count (one-hot, as DeepChem's featurizer "
        "has them) to Kearnes et al.'s 27 atom features (default: %(default)s)",
    )
    group.add_argument("--atom-dim", type=int, default=50, help="atom state size (default: 50)")
    group.add_argument("--pair-dim", type=int, default=50, help="pair state size (default: 50)")
    group.add_argument(
        "--weave-modules", type=int, default=2, help="weave modules stacked (default: 2)"
    )
    group.add_argument(
        "--gather-dim",
        type=int,
        default=128,
        help="size of each atom's tanh layer before the gather (default: %(default)s)",
    )
    group.add_argument(
        "--gather",
        choices=("sum", "gaussian"),
        default="sum",
        help="molecule vector: the sum over atoms, or the sum of their 11-bin Gaussian "
        "histograms as in Kearnes et al. (default: %(default)s)",
    )
    group.add_argument(
        "--hidden", type=int, default=128, help="the prediction MLP's hidden size (default: 128)"
    )
    group.add_argument(
        "--dropout",
        type=float,
        default=0.0,
        help="dropout after the MLP's hidden layer (default: %(default)s)",
    )
    group.add_argument(
        "--eval-batch-size",
        type=at_least_one,
        default=256,
        help="molecules per batch when evaluating (default: %(default)s)",
    )
    parser.set_defaults(optimizer="adam", batch_size=32)


def labels_of(molecules: Sequence[Molecule], device: torch.device | str) -> tuple[Tensor, Tensor]:
    """The labels and their mask of a batch, ``[n, n_tasks]`` each (float32, bool).

    Example:
        >>> from batchfold.data.molecules import featurize
        >>> y, mask = labels_of([featurize("C", [1.0, None]), featurize("O", [0.0, 1.0])], "cpu")
        >>> y.tolist(), mask.tolist()
        ([[1.0, 0.0], [0.0, 1.0]], [[True, False], [True, True]])
    """
    labels = torch.stack([m.label for m in molecules]).to(device)
    return labels, torch.stack([m.mask for m in molecules]).to(device)


def expect_weave(model: nn.Module) -> WeaveModel:
    """``model`` as a :class:`WeaveModel`, or a ``TypeError`` naming what it is."""
    if not isinstance(model, WeaveModel):
        raise TypeError(f"the molecule tasks run a WeaveModel, got {type(model).__name__}")
    return model


class MoleculeTask(abc.ABC):
    """A Weave model on a molecule data set, for the generic training loop.

    Subclasses set ``name``, ``best_metric`` and ``n_tasks`` and give :meth:`batch_loss`
    and :meth:`metrics`.

    Arguments:
        args: the options of :func:`add_molecule_arguments` and of the loop.
        load: reads the data set, given ``path``, ``max_pair_distance`` and ``atom_counts``.

    Raises:
        FileNotFoundError: the data set is missing (the message says where to get it).
        ValueError: the training split is empty.
    """

    name: str
    best_metric: str
    n_tasks: int
    title: str
    """The title of the task's option group."""
    data_help: str
    """What ``--data`` defaults to."""
    epochs: int
    """The task's default ``--epochs``."""
    lr_schedule = "constant"
    """The task's default ``--lr-schedule``."""
    keep: str | None = "best"
    """The task's default ``--keep``: the best dev epoch's weights, or the last epoch's
    (``None``: the task decides once it has its options)."""
    atom_counts = False
    """The task's default ``--atom-counts``."""
    lower_is_better = False
    unit = "molecules"

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Add the task's options to ``parser`` and set its defaults of the loop's options.

        Arguments:
            parser: the ``batchfold train <task>`` parser.
        """
        add_molecule_arguments(parser, cls.title, cls.data_help)
        parser.set_defaults(
            epochs=cls.epochs,
            lr_schedule=cls.lr_schedule,
            keep=cls.keep,
            atom_counts=cls.atom_counts,
        )

    def __init__(self, args: argparse.Namespace, load: Callable[..., MoleculeSet]) -> None:
        self.args = args
        with warnings.catch_warnings():  # one line below instead of one warning per row
            warnings.simplefilter("ignore", SkippedMoleculeWarning)
            try:
                data = load(
                    args.data,
                    max_pair_distance=args.max_pair_distance,
                    atom_counts=args.atom_counts,
                )
            except FileNotFoundError as err:
                raise FileNotFoundError(f"{err} On the command line: --data PATH.") from err
        if args.splitter == "scaffold":
            parts = scaffold_split(data, FRACTIONS)
        else:
            parts = random_split(data, FRACTIONS, seed=args.split_seed)
        limit = getattr(args, "max_eval", None)
        self.splits: dict[str, list[Molecule]] = {
            "train": parts[0],
            "dev": parts[1][:limit],
            "test": parts[2][:limit],
        }
        if not self.splits["train"]:
            raise ValueError(f"{data.source}: no training molecules ({len(data)} in the file)")
        self._compiled: tuple[WeaveModel, CompiledModel] | None = None
        sizes = ", ".join(f"{len(self.splits[s])} {s}" for s in SPLITS)
        skipped = f"; skipped {len(data.skipped)} unparsable SMILES" if data.skipped else ""
        print(f"{self.name}: {sizes} molecules ({args.splitter} split){skipped}")

    def train_items(self) -> list[Molecule]:
        """The training molecules."""
        return self.splits["train"]

    def build_model(self) -> WeaveModel:
        """A freshly initialised :class:`WeaveModel` of the configured sizes."""
        a = self.args
        return WeaveModel(
            self.n_tasks,
            a.atom_dim,
            a.pair_dim,
            a.weave_modules,
            a.gather_dim,
            a.hidden,
            a.gather,
            dropout=a.dropout,
            atom_features=ATOM_FEATURES + (ATOM_COUNT_FEATURES if a.atom_counts else 0),
        )

    def param_groups(self, model: nn.Module, lr: float) -> list[dict[str, Any]]:
        """Every parameter at ``lr``."""
        return [{"params": list(model.parameters()), "lr": lr}]

    def predict(self, model: nn.Module, molecules: Sequence[Molecule]) -> Tensor:
        """The model's outputs for a batch, ``[n, n_tasks]``, with the configured front end."""
        weave = expect_weave(model)
        if self.args.front_end == "blocks":
            if self._compiled is None or self._compiled[0] is not weave:
                blocks = compile_blocks(weave_blocks(weave), scheduler=self.args.scheduler)
                self._compiled = (weave, blocks)
            outputs, _ = self._compiled[1](list(molecules))
            return outputs
        per_molecule = bf.batch_map(
            lambda m: weave_predict(weave, m), molecules, scheduler=self.args.scheduler
        )
        return torch.stack(per_molecule)

    @abc.abstractmethod
    def batch_loss(self, outputs: Tensor, molecules: Sequence[Molecule]) -> tuple[Tensor, int]:
        """The summed loss of a batch's outputs ``[n, n_tasks]`` and the number of its terms."""

    @abc.abstractmethod
    def metrics(self, outputs: Tensor, molecules: Sequence[Molecule]) -> dict[str, float]:
        """The metrics of a whole split's outputs ``[n, n_tasks]``."""

    def loss(self, model: nn.Module, batch: Sequence[Molecule]) -> tuple[Tensor, int]:
        """The summed loss of a batch, run batched by the front end."""
        return self.batch_loss(self.predict(model, batch), batch)

    def eager_loss(self, model: nn.Module, batch: Sequence[Molecule]) -> tuple[Tensor, int]:
        """:meth:`loss` computed one molecule at a time in plain PyTorch."""
        weave = expect_weave(model)
        return self.batch_loss(torch.stack([weave_predict(weave, m) for m in batch]), batch)

    def evaluate(self, model: nn.Module, split: str) -> dict[str, float]:
        """The metrics on ``"dev"`` or ``"test"``, predicted in batches of --eval-batch-size."""
        if split not in ("dev", "test"):
            raise ValueError(f"{self.name} evaluates on 'dev' or 'test', got {split!r}")
        molecules, size = self.splits[split], self.args.eval_batch_size
        if not molecules or size < 1:
            raise ValueError(
                f"{self.name} {split}: nothing to evaluate ({len(molecules)} molecules, "
                f"--eval-batch-size {size})"
            )
        with torch.no_grad():
            outputs = torch.cat(
                [
                    self.predict(model, molecules[i : i + size])
                    for i in range(0, len(molecules), size)
                ]
            )
        return self.metrics(outputs, molecules)
