"""Molecules from SMILES: rdkit graphs with Kearnes et al. (2016) features, ESOL and Tox21.

:func:`featurize` parses a SMILES with rdkit and returns a :class:`Molecule`: the SMILES and
plain tensors, no rdkit objects, so it pickles and any front end can read it.
:func:`load_esol` (regression, 1,128 molecules) and :func:`load_tox21` (12 binary tasks, 7,831
rows) read MoleculeNet's CSV files into a :class:`MoleculeSet`; :func:`read_molecule_csv`
reads any such file. :func:`random_split` and :func:`scaffold_split` split a data set.

:class:`MoleculeSet` and :func:`read_molecule_csv` are in :mod:`batchfold.data.molecule_csv`,
the splits in :mod:`batchfold.data.molecule_splits` and the features in
:mod:`batchfold.data.molecule_features`; this module holds the ESOL and Tox21 loaders and
re-exports the rest.

Atom features (``atom_features``, :data:`ATOM_FEATURES` = 27 columns), following Table 1 of
Kearnes et al., "Molecular graph convolutions: moving beyond fingerprints" (2016):

- 0-10: element, one-hot: H, C, N, O, F, P, S, Cl, Br, I, other (the paper's last column is
  "metal"; here it takes every other element, B, Si and Se included);
- 11-12: chirality R, S (CIP labels; neither for other atoms and pseudo-asymmetric r/s);
- 13: formal charge (an integer);
- 14: Gasteiger partial charge (``rdPartialCharges.ComputeGasteigerCharges``); where rdkit
  has no parameters (metals, tin, mercury, ...) it gives NaN or inf for some atoms or all of
  the molecule's, and those charges are set to 0, so no NaN ever reaches a tensor;
- 15-20: for each ring size 3 to 8, how many of rdkit's smallest rings hold the atom;
- 21-23: hybridization sp, sp2, sp3, one-hot (none of them for other types);
- 24-25: hydrogen-bond donor, acceptor, by rdkit's Lipinski SMARTS patterns
  (``Lipinski.HDonorSmarts``, ``HAcceptorSmarts``). DeepChem's Weave featurizer uses
  rdkit's ``BaseFeatures.fdef`` instead, whose acceptors miss anionic and furan oxygens;
- 26: aromatic;
- with ``atom_counts=True`` (:data:`ATOM_COUNT_FEATURES` = 11 more columns), 27-32: the
  atom's degree 0-5 (5 for 5 or more), one-hot; 33-37: its hydrogens 0-4 (implicit and
  explicit, 4 for 4 or more), one-hot. Two of the atom features of DeepChem's featurizer,
  with which MoleculeNet's Weave results were made; the paper's table has neither, so a
  model never sees a hydrogen it does not hold as an atom.

Pair features (``pair_features``, :data:`PAIR_FEATURES` = 12 columns, Kearnes et al.
Table 2), one row per ordered atom pair ``(i, j)`` with ``i != j`` in ``pair_index``:

- 0-3: bond type single, double, triple, aromatic, one-hot (none for unbonded pairs, nor
  for rarer bond types such as dative ones);
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

import os
from collections.abc import Sequence
from pathlib import Path

from batchfold.data.molecule_csv import MoleculeSet, SkippedMoleculeWarning, read_molecule_csv
from batchfold.data.molecule_features import (
    ATOM_COUNT_FEATURE_NAMES,
    ATOM_COUNT_FEATURES,
    ATOM_FEATURE_NAMES,
    ATOM_FEATURES,
    PAIR_FEATURE_NAMES,
    PAIR_FEATURES,
    Molecule,
    MoleculeFormatError,
    featurize,
)
from batchfold.data.molecule_splits import murcko_scaffold, random_split, scaffold_split
from batchfold.data.paths import data_roots, find_data

__all__ = [
    "ATOM_COUNT_FEATURES",
    "ATOM_COUNT_FEATURE_NAMES",
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
    atom_counts: bool = False,
) -> MoleculeSet:
    """Read ESOL (Delaney 2004): 1,128 molecules with their measured log solubility.

    The label is the one column :data:`ESOL_TARGET` (log mol/L). ``path`` may be
    ``delaney-processed.csv`` or a folder holding it; without it the ``esol`` data folder is
    used (see :func:`batchfold.data.paths.find_data`).

    Arguments:
        path: the file or its folder.
        strict: raise on a SMILES rdkit cannot parse instead of skipping it.
        max_pair_distance: passed to :func:`featurize`.
        atom_counts: passed to :func:`featurize`.

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
        file,
        "smiles",
        [ESOL_TARGET],
        strict=strict,
        max_pair_distance=max_pair_distance,
        atom_counts=atom_counts,
    )


def load_tox21(
    path: str | os.PathLike[str] | None = None,
    *,
    strict: bool = False,
    max_pair_distance: int | None = None,
    atom_counts: bool = False,
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
        atom_counts: passed to :func:`featurize`.

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
        file,
        "smiles",
        TOX21_TASKS,
        binary=True,
        strict=strict,
        max_pair_distance=max_pair_distance,
        atom_counts=atom_counts,
    )
