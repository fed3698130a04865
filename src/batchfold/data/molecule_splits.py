"""Splitting a data set into train, validation and test: at random or by molecular scaffold.

:func:`random_split` shuffles with a seed; :func:`scaffold_split` keeps all molecules with
one Bemis-Murcko scaffold (:func:`murcko_scaffold`) in the same part, as DeepChem and
MoleculeNet do. :mod:`batchfold.data.molecules` re-exports these names.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TypeVar

from rdkit.Chem.Scaffolds import MurckoScaffold

from batchfold.data.molecule_features import Molecule, MoleculeFormatError, parse_smiles

__all__ = ["murcko_scaffold", "random_split", "scaffold_split"]

T = TypeVar("T")
M = TypeVar("M", bound="Molecule | str")


def _cutoffs(fractions: Sequence[float], n: int) -> tuple[int, int]:
    """Where the train and validation parts end, for ``n`` items."""
    if len(fractions) != 3 or min(fractions) < 0 or abs(sum(fractions) - 1) > 1e-6:
        raise ValueError(
            f"fractions must be three non-negative numbers (train, valid, test) summing to 1, "
            f"got {tuple(fractions)}"
        )
    return round(fractions[0] * n), round((fractions[0] + fractions[1]) * n)


def random_split(
    items: Sequence[T], fractions: Sequence[float] = (0.8, 0.1, 0.1), seed: int = 0
) -> tuple[list[T], list[T], list[T]]:
    """Shuffle ``items`` with a seeded generator and cut them into train, valid and test.

    The sizes are ``fractions`` times ``len(items)``, rounded; the same seed gives the same
    split on every platform.

    Arguments:
        items: the molecules (or anything else).
        fractions: the train, validation and test fractions, summing to 1.
        seed: the seed of the shuffle.

    Returns:
        The three parts, disjoint, together holding every item once.

    Example:
        >>> random_split(range(10), seed=0)
        ([7, 8, 1, 5, 3, 4, 2, 0], [9], [6])
    """
    train_end, valid_end = _cutoffs(fractions, len(items))
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    parts = order[:train_end], order[train_end:valid_end], order[valid_end:]
    train, valid, test = ([items[i] for i in part] for part in parts)
    return train, valid, test


def murcko_scaffold(item: Molecule | str) -> str:
    """The Bemis-Murcko scaffold of a molecule as SMILES, without stereo; ``""`` if acyclic.

    Arguments:
        item: a :class:`Molecule` or a SMILES.

    Returns:
        The scaffold's canonical SMILES.

    Raises:
        MoleculeFormatError: rdkit cannot parse the SMILES.

    Example:
        >>> murcko_scaffold("CCc1ccccc1"), murcko_scaffold("CCO")
        ('c1ccccc1', '')
    """
    smiles = item.smiles if isinstance(item, Molecule) else item
    mol, reason = parse_smiles(smiles)
    if mol is None:
        raise MoleculeFormatError(f"rdkit cannot parse SMILES {smiles.strip()!r} ({reason})")
    return MurckoScaffold.MurckoScaffoldSmiles(mol=mol, includeChirality=False)


def scaffold_split(
    items: Sequence[M], fractions: Sequence[float] = (0.8, 0.1, 0.1), seed: int | None = None
) -> tuple[list[M], list[M], list[M]]:
    """Split molecules so that all molecules with one Bemis-Murcko scaffold share a part.

    As in DeepChem and MoleculeNet: the molecules are grouped by :func:`murcko_scaffold`
    (acyclic ones form one group), the groups are taken largest first, and each goes to train
    if it fits in train's share, else to validation if it fits there, else to test. So the
    split is deterministic and the rarest scaffolds end up in validation and test. Without a
    ``seed``, groups of equal size are ordered as DeepChem orders them (by their first item,
    last first); with one, their order is shuffled by it. Parts may miss ``fractions``
    by up to a group's size.

    Arguments:
        items: the molecules, as :class:`Molecule` or SMILES.
        fractions: the train, validation and test fractions, summing to 1.
        seed: shuffles groups of equal size; ``None`` keeps DeepChem's order.

    Returns:
        The three parts, disjoint, together holding every item once.

    Raises:
        MoleculeFormatError: an item's SMILES cannot be parsed.

    Example:
        >>> scaffold_split(["c1ccccc1O", "CCO", "c1ccccc1N", "C1CCCCC1"], (0.5, 0.25, 0.25))
        (['c1ccccc1O', 'c1ccccc1N'], ['C1CCCCC1'], ['CCO'])
    """
    groups: dict[str, list[int]] = {}
    for i, item in enumerate(items):
        groups.setdefault(murcko_scaffold(item), []).append(i)
    sets = list(groups.values())
    if seed is None:
        sets.sort(key=lambda s: (len(s), s[0]), reverse=True)
    else:
        random.Random(seed).shuffle(sets)
        sets.sort(key=len, reverse=True)
    _cutoffs(fractions, len(items))  # checks the fractions
    # DeepChem compares with the products unrounded: round() moved a group across at .5 up
    train_end, valid_end = fractions[0] * len(items), (fractions[0] + fractions[1]) * len(items)
    train: list[int] = []
    valid: list[int] = []
    test: list[int] = []
    for group in sets:
        if len(train) + len(group) <= train_end:
            train += group
        elif len(train) + len(valid) + len(group) <= valid_end:
            valid += group
        else:
            test += group
    return [items[i] for i in train], [items[i] for i in valid], [items[i] for i in test]
