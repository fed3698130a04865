"""Random molecules for the Weave tests: random atom and pair features, any atom count."""

from __future__ import annotations

import random

import torch

from batchfold.data.molecules import Molecule


def random_molecule(rng: random.Random, n_atoms: int, all_pairs: bool = True) -> Molecule:
    """Random features; every ordered pair, or (``all_pairs=False``) a random half of them."""
    pairs = [(i, j) for i in range(n_atoms) for j in range(n_atoms) if i != j]
    if not all_pairs:
        pairs = [p for p in pairs if rng.random() < 0.5]
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    return Molecule(
        smiles=f"random{n_atoms}",
        atom_features=torch.randn(n_atoms, 27, generator=gen),
        bonds=torch.zeros(0, 2, dtype=torch.int64),
        pair_index=torch.tensor(pairs, dtype=torch.int64).reshape(-1, 2),
        pair_features=torch.randn(len(pairs), 12, generator=gen),
    )
