"""Molecules from SMILES: rdkit graphs with Kearnes et al. (2016) features, ESOL and Tox21.

:func:`featurize` parses a SMILES with rdkit and returns a :class:`Molecule`: the SMILES and
plain tensors, no rdkit objects, so it pickles and any front end can read it.
:func:`load_esol` (regression, 1,128 molecules) and :func:`load_tox21` (12 binary tasks, 7,831
rows) read MoleculeNet's CSV files into a :class:`MoleculeSet`; :func:`read_molecule_csv`
reads any such file. :func:`random_split` and :func:`scaffold_split` split a data set.

Atom features (``atom_features``, :data:`ATOM_FEATURES` = 27 columns), following Table 1 of
Kearnes et al., "Molecular graph convolutions: moving beyond fingerprints" (2016):

- 0-10: element, one-hot: H, C, N, O, F, P, S, Cl, Br, I, other (the paper's last column is
  "metal"; here it takes every other element, B, Si and Se included);
- 11-12: chirality R, S (CIP labels; neither for other atoms and pseudo-asymmetric r/s);
- 13: formal charge (an integer);
- 14: Gasteiger partial charge (``rdPartialCharges.ComputeGasteigerCharges``); where rdkit
  has no parameters (metals, tin, mercury, ...) it gives NaN for the whole molecule, and
  those charges are set to 0, so no NaN ever reaches a tensor;
- 15-20: for each ring size 3 to 8, how many of rdkit's smallest rings hold the atom;
- 21-23: hybridization sp, sp2, sp3, one-hot (none of them for other types);
- 24-25: hydrogen-bond donor, acceptor, by rdkit's Lipinski SMARTS patterns
  (``Lipinski.HDonorSmarts``, ``HAcceptorSmarts``). DeepChem's Weave featurizer uses
  rdkit's ``BaseFeatures.fdef`` instead, whose acceptors miss anionic and furan oxygens;
- 26: aromatic.

Pair features (``pair_features``, :data:`PAIR_FEATURES` = 12 columns, Kearnes et al.
Table 2), one row per ordered atom pair ``(i, j)`` with ``i != j`` in ``pair_index``:

- 0-3: bond type single, double, triple, aromatic, one-hot (none for unbonded pairs);
- 4-10: graph distance: column ``3 + d`` is 1 when the shortest path is at most ``d`` bonds,
  ``d`` = 1..7 (cumulative, as in the paper; DeepChem's Weave featurizer uses the exact
  distance instead). Atoms in different fragments (salts) have all seven at 0;
- 11: whether the two atoms share a ring.

By default every ordered pair is kept, as in Kearnes et al., so a molecule of ``n`` atoms
has ``n (n - 1)`` pairs (Tox21: 3.6 million pairs, about 230 MB); ``max_pair_distance``
keeps only pairs up to that many bonds apart. Self pairs are not listed: an atom's own state
is in ``atom_features``. Hydrogens are not atoms unless the SMILES needs them as such
(``[2H]``, ``[H][H]``). The column names are in :data:`ATOM_FEATURE_NAMES` and
:data:`PAIR_FEATURE_NAMES`.

A SMILES that rdkit cannot parse is never turned into NaNs: the loaders warn once per such
row (``file:line: rdkit cannot parse SMILES '...' (why); skipped``, a
:class:`SkippedMoleculeWarning`), skip it and report the count; with ``strict=True`` they
raise :class:`MoleculeFormatError` instead.
"""

from __future__ import annotations

import csv
import gzip
import math
import os
import random
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO, TypeVar, overload

from rdkit.Chem.Scaffolds import MurckoScaffold

from batchfold.data.molecule_features import (
    ATOM_FEATURE_NAMES,
    ATOM_FEATURES,
    PAIR_FEATURE_NAMES,
    PAIR_FEATURES,
    Molecule,
    MoleculeFormatError,
    featurize,
    featurize_mol,
    parse_smiles,
)
from batchfold.data.paths import data_roots, find_data

__all__ = [
    "ATOM_FEATURES",
    "ATOM_FEATURE_NAMES",
    "ESOL_TARGET",
    "ESOL_URL",
    "PAIR_FEATURES",
    "PAIR_FEATURE_NAMES",
    "TOX21_TASKS",
    "TOX21_URL",
    "Molecule",
    "MoleculeFormatError",
    "MoleculeSet",
    "SkippedMoleculeWarning",
    "featurize",
    "load_esol",
    "load_tox21",
    "murcko_scaffold",
    "random_split",
    "read_molecule_csv",
    "scaffold_split",
]

ESOL_URL = "https://deepchemdata.s3-us-west-1.amazonaws.com/datasets/delaney-processed.csv"
"""Where DeepChem distributes MoleculeNet's ESOL file."""

TOX21_URL = "https://deepchemdata.s3-us-west-1.amazonaws.com/datasets/tox21.csv.gz"
"""Where DeepChem distributes MoleculeNet's Tox21 file."""

ESOL_TARGET = "measured log solubility in mols per litre"
"""The ESOL column that is the regression target (log mol/L)."""

TOX21_TASKS = (
    "NR-AR",
    "NR-AR-LBD",
    "NR-AhR",
    "NR-Aromatase",
    "NR-ER",
    "NR-ER-LBD",
    "NR-PPAR-gamma",
    "SR-ARE",
    "SR-ATAD5",
    "SR-HSE",
    "SR-MMP",
    "SR-p53",
)
"""The 12 Tox21 tasks, in the order of :attr:`Molecule.label`."""

T = TypeVar("T")
M = TypeVar("M", bound="Molecule | str")


class SkippedMoleculeWarning(UserWarning):
    """A row of a molecule file was skipped because rdkit cannot parse its SMILES."""


@dataclass(frozen=True, eq=False, repr=False)
class MoleculeSet(Sequence[Molecule]):
    """The molecules read from one file, with the task names and the rows that were skipped.

    It is a sequence of :class:`Molecule`, so it can go straight to the splits.

    Arguments:
        molecules: the molecules, in file order.
        tasks: the label columns, in the order of :attr:`Molecule.label`.
        source: the file read.
        skipped: ``(line, SMILES)`` of each row whose SMILES rdkit cannot parse.
    """

    molecules: tuple[Molecule, ...]
    tasks: tuple[str, ...]
    source: str
    skipped: tuple[tuple[int, str], ...] = ()

    def __len__(self) -> int:
        return len(self.molecules)

    @overload
    def __getitem__(self, index: int) -> Molecule: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[Molecule, ...]: ...
    def __getitem__(self, index: int | slice) -> Molecule | tuple[Molecule, ...]:
        return self.molecules[index]

    def __iter__(self) -> Iterator[Molecule]:
        return iter(self.molecules)

    def __repr__(self) -> str:
        return (
            f"MoleculeSet({self.source!r}, molecules={len(self)}, tasks={len(self.tasks)}, "
            f"skipped={len(self.skipped)})"
        )


def _open(file: Path) -> TextIO:
    if file.suffix == ".gz":
        return gzip.open(file, "rt", encoding="utf-8-sig", newline="")
    return open(file, encoding="utf-8-sig", newline="")


def _label(cell: str, column: str, binary: bool, where: str) -> float | None:
    """The value of a label cell; ``None`` for an empty (unmeasured) one."""
    text = cell.strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if value in (0.0, 1.0) if binary else math.isfinite(value):
        return value
    expected = "0, 1" if binary else "a finite number"
    raise MoleculeFormatError(
        f"{where}: column {column!r}: expected {expected} or an empty cell, found {cell!r}"
    )


def read_molecule_csv(
    file: str | os.PathLike[str],
    smiles_column: str = "smiles",
    label_columns: Sequence[str] = (),
    *,
    binary: bool = False,
    strict: bool = False,
    max_pair_distance: int | None = None,
) -> MoleculeSet:
    """Read a CSV file with a header, a SMILES column and label columns into molecules.

    Gzip-compressed files (``.gz``) and CRLF line endings are fine. An empty label cell is a
    missing label: value 0 with ``mask`` False. A row whose SMILES rdkit cannot parse is
    skipped with a :class:`SkippedMoleculeWarning` naming the file, line and SMILES, and a
    last warning gives the count; ``strict=True`` raises instead.

    Arguments:
        file: the CSV file.
        smiles_column: the header name of the SMILES column.
        label_columns: the header names of the label columns, in label order.
        binary: labels must be 0 or 1 (classification) rather than any finite number.
        strict: raise :class:`MoleculeFormatError` on a SMILES rdkit cannot parse.
        max_pair_distance: passed to :func:`featurize`.

    Returns:
        The :class:`MoleculeSet`.

    Raises:
        FileNotFoundError: there is no such file.
        MoleculeFormatError: a missing column, a row with the wrong number of fields or a bad
            label (always), or an unparsable SMILES (with ``strict``); the message starts
            with ``file:line:``.

    Example:
        >>> import tempfile, pathlib
        >>> f = pathlib.Path(tempfile.mkdtemp()) / "tiny.csv"
        >>> _ = f.write_text("smiles,y\\nCCO,1\\nC1CC,0\\nc1ccccc1,\\n")
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     data = read_molecule_csv(f, "smiles", ["y"], binary=True)
        >>> data.skipped, [m.mask.tolist() for m in data]
        (((3, 'C1CC'),), [[True], [False]])
        >>> print(caught[0].message)  # doctest: +ELLIPSIS
        /...tiny.csv:3: rdkit cannot parse SMILES 'C1CC' (not valid SMILES syntax); skipped
    """
    source = str(file)
    molecules: list[Molecule] = []
    skipped: list[tuple[int, str]] = []
    with _open(Path(file)) as f:
        reader = csv.reader(f)
        header = [name.strip() for name in next(reader, [])]
        wanted = [smiles_column, *label_columns]
        for name in wanted:
            if name not in header:
                raise MoleculeFormatError(
                    f"{source}:1: no column {name!r} in the header (it has {', '.join(header)})"
                )
        smiles_at, *label_at = (header.index(name) for name in wanted)
        for row in reader:
            where = f"{source}:{reader.line_num}"
            if not any(cell.strip() for cell in row):
                continue
            if len(row) != len(header):
                raise MoleculeFormatError(
                    f"{where}: expected {len(header)} fields, found {len(row)}"
                )
            labels = [
                _label(row[i], name, binary, where)
                for i, name in zip(label_at, label_columns, strict=True)
            ]
            smiles = row[smiles_at].strip()
            mol, reason = parse_smiles(smiles)
            if mol is None:
                message = f"{where}: rdkit cannot parse SMILES {smiles!r} ({reason})"
                if strict:
                    raise MoleculeFormatError(message)
                warnings.warn(f"{message}; skipped", SkippedMoleculeWarning, stacklevel=2)
                skipped.append((reader.line_num, smiles))
                continue
            molecules.append(
                featurize_mol(mol, smiles, labels, max_pair_distance=max_pair_distance)
            )
    if skipped:
        warnings.warn(
            f"{source}: skipped {len(skipped)} of {len(skipped) + len(molecules)} molecules "
            "whose SMILES rdkit cannot parse (strict=True makes this an error)",
            SkippedMoleculeWarning,
            stacklevel=2,
        )
    return MoleculeSet(tuple(molecules), tuple(label_columns), source, tuple(skipped))


def _data_file(
    name: str, files: Sequence[str], path: str | os.PathLike[str] | None, what: str
) -> Path:
    """The first of ``files`` in data folder ``name`` (or ``path`` itself when it is a file)."""
    found = find_data(name, path)
    if found is not None and found.is_file():
        return found
    if found is not None:
        for file in files:
            if (found / file).is_file():
                return found / file
    folders = [Path(path)] if path is not None else [root / name for root in data_roots()]
    raise FileNotFoundError(
        f"{' or '.join(files)} not found; looked in {', '.join(map(str, folders))}. {what} "
        f"Pass the file or its folder as path=..., or put it in a folder named {name} under "
        "$BATCHFOLD_DATA."
    )


def load_esol(
    path: str | os.PathLike[str] | None = None,
    *,
    strict: bool = False,
    max_pair_distance: int | None = None,
) -> MoleculeSet:
    """Read ESOL (Delaney 2004): 1,128 molecules with their measured log solubility.

    The label is the one column :data:`ESOL_TARGET` (log mol/L). ``path`` may be
    ``delaney-processed.csv`` or a folder holding it; without it the ``esol`` data folder is
    used (see :func:`batchfold.data.paths.find_data`).

    Arguments:
        path: the file or its folder.
        strict: raise on a SMILES rdkit cannot parse instead of skipping it.
        max_pair_distance: passed to :func:`featurize`.

    Returns:
        The :class:`MoleculeSet` (one task).

    Raises:
        FileNotFoundError: no file was found; the message says where to get it.
        MoleculeFormatError: as for :func:`read_molecule_csv`.

    Example:
        >>> load_esol("no/such/folder")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        FileNotFoundError: delaney-processed.csv not found; looked in no/such/folder. ESOL ...
    """
    file = _data_file(
        "esol",
        ["delaney-processed.csv"],
        path,
        f"ESOL (Delaney, J. Chem. Inf. Comput. Sci. 2004) is part of MoleculeNet; DeepChem "
        f"distributes it as {ESOL_URL}.",
    )
    return read_molecule_csv(
        file, "smiles", [ESOL_TARGET], strict=strict, max_pair_distance=max_pair_distance
    )


def load_tox21(
    path: str | os.PathLike[str] | None = None,
    *,
    strict: bool = False,
    max_pair_distance: int | None = None,
) -> MoleculeSet:
    """Read Tox21: 7,831 molecules with 12 binary toxicity labels, 17 % of them missing.

    The labels follow :data:`TOX21_TASKS`; an unmeasured one is 0 with ``mask`` False, so
    leave it out of the loss and the metric with ``mask``. The 8 rows whose SMILES this
    rdkit rejects (hypervalent aluminium) are skipped with a warning. ``path`` may be
    ``tox21.csv`` (or ``.csv.gz``) or a folder holding it; without it the ``moleculenet``
    data folder is used (see :func:`batchfold.data.paths.find_data`).

    Arguments:
        path: the file or its folder.
        strict: raise on a SMILES rdkit cannot parse instead of skipping it.
        max_pair_distance: passed to :func:`featurize`.

    Returns:
        The :class:`MoleculeSet` (12 tasks).

    Raises:
        FileNotFoundError: no file was found; the message says where to get it.
        MoleculeFormatError: as for :func:`read_molecule_csv`.

    Example:
        >>> load_tox21("no/such/folder")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        FileNotFoundError: tox21.csv or tox21.csv.gz not found; looked in no/such/folder. Tox21 ...
    """
    file = _data_file(
        "moleculenet",
        ["tox21.csv", "tox21.csv.gz"],
        path,
        "Tox21 (the 2014 Tox21 Data Challenge, NIH/NCATS) is part of MoleculeNet; DeepChem "
        f"distributes it as {TOX21_URL}, and chemprop (https://github.com/chemprop/chemprop) "
        "has it as data/tox21.csv.",
    )
    return read_molecule_csv(
        file, "smiles", TOX21_TASKS, binary=True, strict=strict, max_pair_distance=max_pair_distance
    )


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
    train_end, valid_end = _cutoffs(fractions, len(items))
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
