"""Molecular graph features for one SMILES, as in Kearnes et al. (2016); see :mod:`.molecules`.

This module holds :class:`Molecule`, :func:`featurize` and the feature layout
(:data:`ATOM_FEATURE_NAMES`, :data:`PAIR_FEATURE_NAMES`); :mod:`batchfold.data.molecules`
re-exports them next to the data set loaders and documents the layout column by column.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from rdkit import Chem, rdBase
from rdkit.Chem import Lipinski, rdPartialCharges

from batchfold.errors import MoleculeFormatError

__all__ = [
    "ATOM_COUNT_FEATURES",
    "ATOM_COUNT_FEATURE_NAMES",
    "ATOM_FEATURES",
    "ATOM_FEATURE_NAMES",
    "PAIR_FEATURES",
    "PAIR_FEATURE_NAMES",
    "Molecule",
    "MoleculeFormatError",
    "featurize",
    "featurize_mol",
    "parse_smiles",
]

_ELEMENTS = ("H", "C", "N", "O", "F", "P", "S", "Cl", "Br", "I")
_RING_SIZES = range(3, 9)
_MAX_DISTANCE = 7

ATOM_FEATURE_NAMES: tuple[str, ...] = (
    *(f"element={symbol}" for symbol in _ELEMENTS),
    "element=other",
    "chirality=R",
    "chirality=S",
    "formal_charge",
    "partial_charge",
    *(f"rings_of_size={size}" for size in _RING_SIZES),
    "hybridization=sp",
    "hybridization=sp2",
    "hybridization=sp3",
    "hbond_donor",
    "hbond_acceptor",
    "aromatic",
)
"""The name of each column of :attr:`Molecule.atom_features`, in order."""

PAIR_FEATURE_NAMES: tuple[str, ...] = (
    "bond=single",
    "bond=double",
    "bond=triple",
    "bond=aromatic",
    *(f"distance<={d}" for d in range(1, _MAX_DISTANCE + 1)),
    "same_ring",
)
"""The name of each column of :attr:`Molecule.pair_features`, in order."""

ATOM_COUNT_FEATURE_NAMES: tuple[str, ...] = (
    *(f"degree={d}" for d in range(6)),
    *(f"hydrogens={h}" for h in range(5)),
)
"""The columns ``atom_counts=True`` adds after :data:`ATOM_FEATURE_NAMES`: the atom's degree
(heavy-atom neighbours, 5 for 5 or more) and its hydrogens (implicit and explicit, 4 for 4 or
more), one-hot, as DeepChem's featurizer has them."""

ATOM_FEATURES = len(ATOM_FEATURE_NAMES)
"""The number of features per atom (27)."""

ATOM_COUNT_FEATURES = len(ATOM_COUNT_FEATURE_NAMES)
"""The number of columns ``atom_counts=True`` adds (11)."""

PAIR_FEATURES = len(PAIR_FEATURE_NAMES)
"""The number of features per atom pair (12)."""

_COLUMN = {name: i for i, name in enumerate(ATOM_FEATURE_NAMES)}
_HYBRIDIZATION = {
    Chem.HybridizationType.SP: _COLUMN["hybridization=sp"],
    Chem.HybridizationType.SP2: _COLUMN["hybridization=sp2"],
    Chem.HybridizationType.SP3: _COLUMN["hybridization=sp3"],
}
_BOND = {
    Chem.BondType.SINGLE: 0,
    Chem.BondType.DOUBLE: 1,
    Chem.BondType.TRIPLE: 2,
    Chem.BondType.AROMATIC: 3,
}


@dataclass(frozen=True, eq=False, repr=False)
class Molecule:
    """One molecule as plain tensors: atom features, bonds, atom pairs and labels.

    Arguments:
        smiles: the SMILES it was made from.
        atom_features: ``[n_atoms, ATOM_FEATURES]`` float32, atoms in rdkit's (SMILES) order.
        bonds: ``[2 * n_bonds, 2]`` int64 atom indices; rows ``2k`` and ``2k + 1`` are bond
            ``k`` in both directions.
        pair_index: ``[n_pairs, 2]`` int64: the ordered atom pairs ``(i, j)``, ``i != j``, in
            row-major order (all of them unless a ``max_pair_distance`` was given).
        pair_features: ``[n_pairs, PAIR_FEATURES]`` float32, one row per row of ``pair_index``.
        label: ``[n_tasks]`` float32 targets; ``0`` where the label is missing.
        mask: ``[n_tasks]`` bool, ``True`` where the label was measured.

    Example:
        >>> m = featurize("CCO", label=[1.5])
        >>> m
        Molecule('CCO', atoms=3, bonds=2, pairs=6, tasks=1)
        >>> m.bonds.tolist(), m.label.tolist(), m.mask.tolist()
        ([[0, 1], [1, 0], [1, 2], [2, 1]], [1.5], [True])
    """

    smiles: str
    atom_features: torch.Tensor
    bonds: torch.Tensor
    pair_index: torch.Tensor
    pair_features: torch.Tensor
    label: torch.Tensor = field(default_factory=lambda: torch.zeros(0))
    mask: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.bool))

    @property
    def n_atoms(self) -> int:
        """The number of atoms rdkit keeps: heavy atoms, and hydrogens only where the molecule
        needs them (``[H][H]``, ``[2H]``; ``[H]OC`` has 2)."""
        return self.atom_features.shape[0]

    def __repr__(self) -> str:
        return (
            f"Molecule({self.smiles!r}, atoms={self.n_atoms}, bonds={self.bonds.shape[0] // 2}, "
            f"pairs={self.pair_index.shape[0]}, tasks={self.label.shape[0]})"
        )


def parse_smiles(smiles: str) -> tuple[Chem.Mol | None, str]:
    """Parse a SMILES with rdkit, with rdkit's own log messages silenced.

    Arguments:
        smiles: the SMILES; surrounding whitespace is ignored.

    Returns:
        The molecule and ``""``, or ``None`` and why rdkit rejected it (an empty SMILES and
        one with no atoms are rejected too).

    Example:
        >>> parse_smiles("O=CO[AlH3](OC=O)OC=O")
        (None, 'Explicit valence for atom # 3 Al, 6, is greater than permitted')
    """
    smiles = smiles.strip()
    if not smiles:
        return None, "empty SMILES"
    with rdBase.BlockLogs():
        mol = Chem.MolFromSmiles(smiles)
        if mol is not None:
            return (mol, "") if mol.GetNumAtoms() else (None, "no atoms")
        raw = Chem.MolFromSmiles(smiles, sanitize=False)
        if raw is None:
            return None, "not valid SMILES syntax"
        problems = [p.Message() for p in Chem.DetectChemistryProblems(raw)]
    if len(problems) > 1:
        return None, f"{problems[0]}; {len(problems) - 1} more problems"
    return None, problems[0] if problems else "rdkit rejected it"


def featurize(
    smiles: str,
    label: Sequence[float | None] = (),
    *,
    max_pair_distance: int | None = None,
    atom_counts: bool = False,
) -> Molecule:
    """Parse a SMILES with rdkit and compute its atom and pair features.

    The columns are listed in :mod:`batchfold.data.molecules`. Gasteiger partial charges that
    rdkit cannot compute (NaN or infinite, as for tin or mercury compounds) are set to 0.

    Arguments:
        smiles: the molecule; surrounding whitespace is ignored.
        label: the targets, ``None`` for a missing one (it gets ``mask`` False and value 0).
        max_pair_distance: keep only pairs at most this many bonds apart (pairs in different
            fragments are infinitely far apart); by default all ordered pairs ``i != j``.
        atom_counts: add the columns :data:`ATOM_COUNT_FEATURE_NAMES` (each atom's degree
            and hydrogens) after the paper's 27.

    Returns:
        The :class:`Molecule`.

    Raises:
        MoleculeFormatError: rdkit cannot parse the SMILES.
        ValueError: a label is NaN or infinite (write ``None`` for a missing one).

    Example:
        >>> m = featurize("c1ccccc1")
        >>> m.atom_features.shape, m.pair_features.shape, m.pair_index[:2].tolist()
        (torch.Size([6, 27]), torch.Size([30, 12]), [[0, 1], [0, 2]])
    """
    mol, reason = parse_smiles(smiles)
    if mol is None:
        raise MoleculeFormatError(f"rdkit cannot parse SMILES {smiles.strip()!r} ({reason})")
    return featurize_mol(
        mol, smiles, label, max_pair_distance=max_pair_distance, atom_counts=atom_counts
    )


def featurize_mol(
    mol: Chem.Mol,
    smiles: str,
    label: Sequence[float | None] = (),
    *,
    max_pair_distance: int | None = None,
    atom_counts: bool = False,
) -> Molecule:
    """The :class:`Molecule` of an rdkit molecule that :func:`parse_smiles` returned.

    This is :func:`featurize` without the parsing; it sets Gasteiger charges on ``mol``.

    Arguments:
        mol: the parsed molecule.
        smiles: the SMILES it came from, kept in :attr:`Molecule.smiles`.
        label: as for :func:`featurize`.
        max_pair_distance: as for :func:`featurize`.
        atom_counts: as for :func:`featurize`.

    Returns:
        The :class:`Molecule`.

    Raises:
        ValueError: a label is NaN or infinite.

    Example:
        >>> mol, _ = parse_smiles("CC")
        >>> featurize_mol(mol, "CC", [None]).mask.tolist()
        [False]
    """
    values = [0.0 if y is None else float(y) for y in label]
    if not all(map(math.isfinite, values)):
        raise ValueError(f"label {list(label)} of {smiles!r} is not finite; use None for missing")
    pair_index, pair_features = _pair_features(mol, max_pair_distance)
    bonds = [
        pair
        for bond in mol.GetBonds()
        for pair in (
            (bond.GetBeginAtomIdx(), bond.GetEndAtomIdx()),
            (bond.GetEndAtomIdx(), bond.GetBeginAtomIdx()),
        )
    ]
    return Molecule(
        smiles=smiles.strip(),
        atom_features=torch.from_numpy(_atom_features(mol, atom_counts)),
        bonds=torch.tensor(bonds, dtype=torch.int64).reshape(-1, 2),
        pair_index=torch.from_numpy(pair_index),
        pair_features=torch.from_numpy(pair_features),
        label=torch.tensor(values, dtype=torch.float32),
        mask=torch.tensor([y is not None for y in label], dtype=torch.bool),
    )


def _atom_features(mol: Chem.Mol, counts: bool) -> np.ndarray:
    width = ATOM_FEATURES + ATOM_COUNT_FEATURES if counts else ATOM_FEATURES
    features = np.zeros((mol.GetNumAtoms(), width), dtype=np.float32)
    rdPartialCharges.ComputeGasteigerCharges(mol)
    centres = dict(
        Chem.FindMolChiralCenters(mol, includeUnassigned=False, useLegacyImplementation=False)
    )
    donors = {i for (i,) in mol.GetSubstructMatches(Lipinski.HDonorSmarts)}
    acceptors = {i for (i,) in mol.GetSubstructMatches(Lipinski.HAcceptorSmarts)}
    for atom in mol.GetAtoms():
        row = features[atom.GetIdx()]
        row[_COLUMN.get(f"element={atom.GetSymbol()}", _COLUMN["element=other"])] = 1
        # Pseudo-asymmetric centres come back as lowercase r/s and get neither column.
        if (cip := centres.get(atom.GetIdx())) in ("R", "S"):
            row[_COLUMN[f"chirality={cip}"]] = 1
        row[_COLUMN["formal_charge"]] = atom.GetFormalCharge()
        charge = atom.GetDoubleProp("_GasteigerCharge")
        row[_COLUMN["partial_charge"]] = charge if math.isfinite(charge) else 0.0
        if (column := _HYBRIDIZATION.get(atom.GetHybridization())) is not None:
            row[column] = 1
        row[_COLUMN["hbond_donor"]] = atom.GetIdx() in donors
        row[_COLUMN["hbond_acceptor"]] = atom.GetIdx() in acceptors
        row[_COLUMN["aromatic"]] = atom.GetIsAromatic()
        if counts:
            heavy = sum(n.GetAtomicNum() > 1 for n in atom.GetNeighbors())  # as documented
            row[ATOM_FEATURES + min(heavy, 5)] = 1
            row[ATOM_FEATURES + 6 + min(atom.GetTotalNumHs(), 4)] = 1
    first_ring = _COLUMN[f"rings_of_size={_RING_SIZES[0]}"]
    for ring in mol.GetRingInfo().AtomRings():
        if len(ring) in _RING_SIZES:
            features[list(ring), first_ring + len(ring) - _RING_SIZES[0]] += 1
    return features


def _pair_features(mol: Chem.Mol, max_distance: int | None) -> tuple[np.ndarray, np.ndarray]:
    n = mol.GetNumAtoms()
    full = np.zeros((n, n, PAIR_FEATURES), dtype=np.float32)
    for bond in mol.GetBonds():
        if (column := _BOND.get(bond.GetBondType())) is not None:
            i, j = bond.GetBeginAtomIdx(), bond.GetEndAtomIdx()
            full[i, j, column] = full[j, i, column] = 1
    # Atoms in different fragments are 1e8 apart in rdkit's distance matrix.
    distance = Chem.GetDistanceMatrix(mol)
    full[:, :, len(_BOND) : len(_BOND) + _MAX_DISTANCE] = distance[:, :, None] <= np.arange(
        1, _MAX_DISTANCE + 1
    )
    rings = mol.GetRingInfo().AtomRings()
    member = np.zeros((n, len(rings)), dtype=np.float32)
    for k, ring in enumerate(rings):
        member[list(ring), k] = 1
    full[:, :, -1] = member @ member.T > 0
    keep = ~np.eye(n, dtype=bool)
    if max_distance is not None:  # and never across fragments, however large the bound
        keep &= (distance <= max_distance) & (distance < 1e8)
    return np.argwhere(keep).astype(np.int64), full[keep]
