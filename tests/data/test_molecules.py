from __future__ import annotations

import gzip
import math
import pickle
import re
from pathlib import Path

import pytest
import torch
from rdkit import Chem
from rdkit.Chem import rdPartialCharges

from batchfold.data import molecules
from batchfold.data.molecules import (
    ATOM_COUNT_FEATURE_NAMES,
    ATOM_COUNT_FEATURES,
    ATOM_FEATURE_NAMES,
    ATOM_FEATURES,
    ESOL_TARGET,
    ESOL_URL,
    PAIR_FEATURE_NAMES,
    PAIR_FEATURES,
    TOX21_TASKS,
    TOX21_URL,
    Molecule,
    MoleculeFormatError,
    SkippedMoleculeWarning,
    featurize,
    load_esol,
    load_tox21,
    murcko_scaffold,
    random_split,
    read_molecule_csv,
    scaffold_split,
)
from batchfold.data.paths import find_data
from batchfold.errors import BatchfoldError

ESOL_HEADER = (
    "Compound ID,ESOL predicted log solubility in mols per litre,Minimum Degree,"
    "Molecular Weight,Number of H-Bond Donors,Number of Rings,Number of Rotatable Bonds,"
    "Polar Surface Area,measured log solubility in mols per litre,smiles"
)
TOX21_HEADER = "smiles," + ",".join(TOX21_TASKS)


def atom(m: Molecule, i: int) -> dict[str, float]:
    """The non-zero features of atom ``i``, by name."""
    row = m.atom_features[i].tolist()
    return {name: value for name, value in zip(ATOM_FEATURE_NAMES, row, strict=True) if value}


def pair(m: Molecule, i: int, j: int) -> set[str]:
    """The names of the features set for the ordered pair ``(i, j)``."""
    (row,) = [k for k, p in enumerate(m.pair_index.tolist()) if p == [i, j]]
    values = m.pair_features[row].tolist()
    assert set(values) <= {0.0, 1.0}
    return {name for name, value in zip(PAIR_FEATURE_NAMES, values, strict=True) if value}


def charge(m: Molecule, i: int) -> float:
    return m.atom_features[i, ATOM_FEATURE_NAMES.index("partial_charge")].item()


def write(file: Path, lines: list[str]) -> Path:
    file.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return file


def test_layout() -> None:
    assert (ATOM_FEATURES, PAIR_FEATURES) == (27, 12)
    assert len(set(ATOM_FEATURE_NAMES)) == 27 and len(set(PAIR_FEATURE_NAMES)) == 12
    # The module docstring documents the columns by index.
    assert ATOM_FEATURE_NAMES[10:15] == (
        "element=other",
        "chirality=R",
        "chirality=S",
        "formal_charge",
        "partial_charge",
    )
    assert ATOM_FEATURE_NAMES[15] == "rings_of_size=3" and ATOM_FEATURE_NAMES[26] == "aromatic"
    assert PAIR_FEATURE_NAMES[4] == "distance<=1" and PAIR_FEATURE_NAMES[11] == "same_ring"


def test_benzene() -> None:
    m = featurize("c1ccccc1")
    assert m.atom_features.dtype == m.pair_features.dtype == torch.float32
    assert m.bonds.dtype == m.pair_index.dtype == torch.int64
    assert m.n_atoms == 6 and m.bonds.shape == (12, 2) and m.pair_index.shape == (30, 2)
    q = charge(m, 0)
    assert -0.07 < q < -0.05
    for i in range(6):
        assert atom(m, i) == {
            "element=C": 1,
            "partial_charge": pytest.approx(q),
            "rings_of_size=6": 1,
            "hybridization=sp2": 1,
            "aromatic": 1,
        }
    bonded = {"bond=aromatic", "same_ring", *(f"distance<={d}" for d in range(1, 8))}
    assert pair(m, 0, 1) == pair(m, 1, 0) == pair(m, 5, 0) == bonded
    assert pair(m, 0, 2) == {"same_ring", *(f"distance<={d}" for d in range(2, 8))}
    assert pair(m, 0, 3) == {"same_ring", *(f"distance<={d}" for d in range(3, 8))}
    assert sorted(map(tuple, m.bonds.tolist())) == sorted(
        [(i, (i + 1) % 6) for i in range(6)] + [((i + 1) % 6, i) for i in range(6)]
    )
    assert m.pair_index.tolist() == [[i, j] for i in range(6) for j in range(6) if i != j]


def test_ethanol() -> None:
    m = featurize("CCO", label=[-0.77])
    assert m.bonds.tolist() == [[0, 1], [1, 0], [1, 2], [2, 1]]
    assert atom(m, 0).keys() == {"element=C", "partial_charge", "hybridization=sp3"}
    assert atom(m, 2).keys() == {
        "element=O",
        "partial_charge",
        "hybridization=sp3",
        "hbond_donor",
        "hbond_acceptor",
    }
    assert charge(m, 2) < -0.3 < 0 < charge(m, 1)
    assert (
        pair(m, 0, 1) == pair(m, 2, 1) == {"bond=single", *(f"distance<={d}" for d in range(1, 8))}
    )
    assert pair(m, 0, 2) == pair(m, 2, 0) == {f"distance<={d}" for d in range(2, 8)}
    assert m.label.tolist() == [pytest.approx(-0.77)] and m.mask.tolist() == [True]


def test_atom_counts_are_degrees_and_hydrogens() -> None:
    # ethanol, acetate and benzene: CH3-CH2-OH; CH3-C(=O)-O-; six aromatic CH
    counts = {"CCO": [(1, 3), (2, 2), (1, 1)], "CC(=O)[O-]": [(1, 3), (3, 0), (1, 0), (1, 0)]}
    counts["c1ccccc1"] = [(2, 1)] * 6
    for smiles, want in counts.items():
        plain, m = featurize(smiles), featurize(smiles, atom_counts=True)
        assert m.atom_features.shape[1] == ATOM_FEATURES + ATOM_COUNT_FEATURES == 38
        assert torch.equal(m.atom_features[:, :ATOM_FEATURES], plain.atom_features)
        got = [
            {name for name, v in zip(ATOM_COUNT_FEATURE_NAMES, row, strict=True) if v}
            for row in m.atom_features[:, ATOM_FEATURES:].tolist()
        ]
        assert got == [{f"degree={d}", f"hydrogens={h}"} for d, h in want]


def test_degree_counts_heavy_neighbours_and_no_pair_spans_fragments() -> None:
    """A hydrogen held as an atom (``[2H]O...``) counted as a neighbour, against the docs;
    a bound on pair distances of 1e8 or more kept pairs of different fragments (rdkit's
    stand-in distance for them)."""
    m = featurize("[2H]OC", atom_counts=True)
    degrees = [
        next(n for n, v in zip(ATOM_COUNT_FEATURE_NAMES, row, strict=True) if v)
        for row in m.atom_features[:, ATOM_FEATURES:].tolist()
    ]
    assert degrees == ["degree=1", "degree=1", "degree=1"]  # D's O, O, C: one heavy neighbour
    assert featurize("[Na+].[Cl-]", max_pair_distance=10**9).pair_index.shape == (0, 2)


def test_charged_acetate() -> None:
    m = featurize("CC(=O)[O-]")
    formal = ATOM_FEATURE_NAMES.index("formal_charge")
    assert m.atom_features[:, formal].tolist() == [0, 0, 0, -1]
    assert atom(m, 3)["hbond_acceptor"] == 1 and "hbond_donor" not in atom(m, 3)
    assert charge(m, 3) < -0.5
    assert pair(m, 1, 3) == {"bond=single", *(f"distance<={d}" for d in range(1, 8))}
    assert "bond=double" in pair(m, 1, 2)


def test_chirality() -> None:
    names = ("chirality=R", "chirality=S")
    l_alanine, d_alanine, racemic = (
        featurize(s) for s in ("C[C@@H](C(=O)O)N", "C[C@H](C(=O)O)N", "CC(C(=O)O)N")
    )
    assert {k for k in atom(l_alanine, 1) if k in names} == {"chirality=S"}
    assert {k for k in atom(d_alanine, 1) if k in names} == {"chirality=R"}
    for m in (l_alanine, d_alanine, racemic):
        others = [i for i in range(m.n_atoms) if m is racemic or i != 1]
        assert all(not set(atom(m, i)) & set(names) for i in others)


def test_rings_and_fragments() -> None:
    naphthalene = featurize("c1ccc2ccccc2c1")
    fused = [i for i in range(10) if atom(naphthalene, i).get("rings_of_size=6") == 2]
    assert len(fused) == 2
    assert atom(featurize("C1CC1"), 0)["rings_of_size=3"] == 1
    salt = featurize("[Na+].[Cl-]")
    assert "element=other" in atom(salt, 0) and "element=Cl" in atom(salt, 1)
    assert pair(salt, 0, 1) == set() and salt.bonds.shape == (0, 2)
    single = featurize("C")
    assert single.pair_index.shape == (0, 2) and single.pair_features.shape == (0, 12)


def test_partial_charge_nan_becomes_zero() -> None:
    mol = Chem.MolFromSmiles("C[Sn](C)(C)C")
    rdPartialCharges.ComputeGasteigerCharges(mol)
    assert math.isnan(mol.GetAtomWithIdx(1).GetDoubleProp("_GasteigerCharge"))
    m = featurize("C[Sn](C)(C)C")
    assert torch.isfinite(m.atom_features).all()
    assert m.atom_features[:, ATOM_FEATURE_NAMES.index("partial_charge")].tolist() == [0.0] * 5
    assert "element=other" in atom(m, 1)


def test_max_pair_distance() -> None:
    m = featurize("CCCCCC", max_pair_distance=2)
    assert m.pair_index.shape[0] == 10 + 8
    assert all(abs(i - j) <= 2 for i, j in m.pair_index.tolist())
    assert featurize("CCCCCC").pair_index.shape[0] == 30


def test_labels_and_pickle() -> None:
    m = featurize(" CCO ", label=[1.0, None])
    assert m.smiles == "CCO" and repr(m) == "Molecule('CCO', atoms=3, bonds=2, pairs=6, tasks=2)"
    assert m.label.tolist() == [1.0, 0.0] and m.mask.tolist() == [True, False]
    assert m.mask.dtype == torch.bool
    back = pickle.loads(pickle.dumps(m))
    assert back.smiles == m.smiles and torch.equal(back.pair_features, m.pair_features)
    with pytest.raises(ValueError, match="not finite"):
        featurize("CCO", label=[math.nan])


@pytest.mark.parametrize(
    ("smiles", "reason"),
    [
        ("C1CC", "not valid SMILES syntax"),
        ("c1cccc1", "Can't kekulize"),
        ("O=CO[AlH3](OC=O)OC=O", "Explicit valence"),
        ("  ", "empty SMILES"),
    ],
)
def test_bad_smiles_raises(smiles: str, reason: str) -> None:
    with pytest.raises(MoleculeFormatError, match=re.escape(reason)) as info:
        featurize(smiles)
    assert isinstance(info.value, BatchfoldError) and isinstance(info.value, ValueError)
    assert f"rdkit cannot parse SMILES {smiles.strip()!r}" in str(info.value)


def test_bad_smiles_in_a_file_is_reported_with_its_line(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    file = write(tmp_path / "mols.csv", ["smiles,y", "CCO,1", "C1CC,0", "c1ccccc1,0", ",1"])
    with pytest.warns(SkippedMoleculeWarning) as caught:
        data = read_molecule_csv(file, "smiles", ["y"], binary=True)
    assert [str(w.message) for w in caught] == [
        f"{file}:3: rdkit cannot parse SMILES 'C1CC' (not valid SMILES syntax); skipped",
        f"{file}:5: rdkit cannot parse SMILES '' (empty SMILES); skipped",
        f"{file}: skipped 2 of 4 molecules whose SMILES rdkit cannot parse "
        "(strict=True makes this an error)",
    ]
    assert [m.smiles for m in data] == ["CCO", "c1ccccc1"]
    assert data.skipped == ((3, "C1CC"), (5, ""))
    assert data.tasks == ("y",) and len(data) == 2 and data[1].smiles == "c1ccccc1"
    assert "SMILES Parse Error" not in capfd.readouterr().err  # rdkit's own log is silenced
    with pytest.raises(MoleculeFormatError, match=re.escape(f"{file}:3: rdkit cannot parse")):
        read_molecule_csv(file, "smiles", ["y"], strict=True)


def test_malformed_files(tmp_path: Path) -> None:
    file = write(tmp_path / "a.csv", ["smi,y", "CCO,1"])
    with pytest.raises(MoleculeFormatError, match=r"a\.csv:1: no column 'smiles'"):
        read_molecule_csv(file, "smiles", ["y"])
    file = write(tmp_path / "b.csv", ["smiles,y", "CCO,1,2"])
    with pytest.raises(MoleculeFormatError, match=r"b\.csv:2: expected 2 fields, found 3"):
        read_molecule_csv(file, "smiles", ["y"])
    file = write(tmp_path / "c.csv", ["smiles,y", "CCO,nan"])
    with pytest.raises(MoleculeFormatError, match=r"c\.csv:2: column 'y': expected a finite"):
        read_molecule_csv(file, "smiles", ["y"])
    file = write(tmp_path / "d.csv", ["smiles,y", "CCO,2"])
    with pytest.raises(MoleculeFormatError, match=r"d\.csv:2: column 'y': expected 0, 1"):
        read_molecule_csv(file, "smiles", ["y"], binary=True)


def test_load_esol(tmp_path: Path) -> None:
    write(
        tmp_path / "delaney-processed.csv",
        [
            ESOL_HEADER,
            "Amigdalin,-0.974,1,457.43,7,3,7,202.32,-0.77,"
            "OCC3OC(OCC2OC(OC(C#N)c1ccccc1)C(O)C(O)C2O)C(O)C(O)C3O ",  # a trailing space
            '"1,2-Dichloroethane",-1.5,1,98.96,0,0,1,0.0,-1.06,ClCCCl',
        ],
    )
    for path in (tmp_path, tmp_path / "delaney-processed.csv", str(tmp_path)):
        data = load_esol(path)
        assert data.tasks == (ESOL_TARGET,) and data.skipped == ()
        assert [m.label.tolist() for m in data] == [[pytest.approx(-0.77)], [pytest.approx(-1.06)]]
        assert data[0].smiles.endswith("C3O") and data[1].smiles == "ClCCCl"


def test_load_tox21_masks_missing_labels(tmp_path: Path) -> None:
    lines = [
        TOX21_HEADER,
        "CCOc1ccc2nc(S(N)(=O)=O)sc2c1,0,0,1,,,0,0,1,0,0,0,0",
        "CCN1C(=O)NC(c2ccccc2)C1=O,0,0,0,0,0,0,0,,0,,0,0",
        "O=CO[AlH3](OC=O)OC=O,,,,,,,,,,,,1",
    ]
    # DeepChem's gzipped copy has CRLF line endings and an extra mol_id column.
    with gzip.open(tmp_path / "tox21.csv.gz", "wt", encoding="utf-8", newline="") as f:
        f.writelines(f"{line},TOX{i}\r\n" for i, line in enumerate(lines))
    with pytest.warns(SkippedMoleculeWarning) as caught:
        data = load_tox21(tmp_path)
    assert len(caught) == 2 and ".csv.gz:4: rdkit cannot parse SMILES 'O=CO" in str(
        caught[0].message
    )
    assert len(data) == 2 and data.skipped == ((4, "O=CO[AlH3](OC=O)OC=O"),)
    assert data.tasks == TOX21_TASKS
    first = data[0]
    assert first.label.shape == first.mask.shape == (12,)
    assert not torch.isnan(first.label).any()
    assert first.mask.tolist() == [True] * 3 + [False] * 2 + [True] * 7
    assert first.label.tolist() == [0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0]
    assert data[1].mask.logical_not().nonzero().flatten().tolist() == [7, 9]


def test_missing_data_names_the_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(FileNotFoundError) as info:
        load_esol(tmp_path / "nowhere")
    message = str(info.value)
    assert "delaney-processed.csv not found" in message and str(tmp_path / "nowhere") in message
    assert ESOL_URL in message and "$BATCHFOLD_DATA" in message
    monkeypatch.setattr(molecules, "find_data", lambda name, path=None: None)
    monkeypatch.setattr(molecules, "data_roots", lambda: [tmp_path / "data"])
    with pytest.raises(FileNotFoundError) as info:
        load_tox21()
    message = str(info.value)
    assert TOX21_URL in message and "chemprop" in message and "Tox21" in message
    assert str(tmp_path / "data" / "moleculenet") in message


SMILES = [
    "c1ccccc1O",
    "c1ccccc1N",
    "Cc1ccccc1",
    "CCO",
    "CCCC",
    "C1CCCCC1",
    "C1CCCCC1C",
    "c1ccc2ccccc2c1",
    "O=C1CCCCC1",
    "c1ccncc1",
    "Cc1ccncc1",
    "CC(=O)O",
]


def test_random_split_is_seeded_and_disjoint() -> None:
    items = list(range(103))
    train, valid, test = random_split(items, (0.7, 0.2, 0.1), seed=3)
    assert (len(train), len(valid), len(test)) == (72, 21, 10)
    assert sorted(train + valid + test) == items
    assert random_split(items, (0.7, 0.2, 0.1), seed=3) == (train, valid, test)
    assert random_split(items, (0.7, 0.2, 0.1), seed=4) != (train, valid, test)
    with pytest.raises(ValueError, match="summing to 1"):
        random_split(items, (0.5, 0.2, 0.1))


def test_scaffold_split_keeps_each_scaffold_in_one_part() -> None:
    mols = [featurize(s) for s in SMILES]
    parts = scaffold_split(mols, (0.5, 0.25, 0.25))
    assert sorted(m.smiles for part in parts for m in part) == sorted(SMILES)
    scaffolds = [{murcko_scaffold(m) for m in part} for part in parts]
    assert not (
        scaffolds[0] & scaffolds[1] or scaffolds[0] & scaffolds[2] or scaffolds[1] & scaffolds[2]
    )
    # Largest groups first (3 acyclic, 3 benzenes) fill train; of the two groups of two, the
    # pyridines (first at 9) come before the cyclohexanes (first at 5), as in DeepChem.
    assert scaffolds == [
        {"", "c1ccccc1"},
        {"c1ccncc1", "O=C1CCCCC1"},
        {"C1CCCCC1", "c1ccc2ccccc2c1"},
    ]
    again = scaffold_split(mols, (0.5, 0.25, 0.25))
    assert [[m.smiles for m in part] for part in again] == [[m.smiles for m in p] for p in parts]
    seeded = [scaffold_split(SMILES, (0.5, 0.25, 0.25), seed=s) for s in (0, 0, 1)]
    assert seeded[0] == seeded[1] != seeded[2]
    assert sorted(seeded[2][0]) == sorted(m.smiles for m in parts[0])  # only ties move
    assert murcko_scaffold("CC(=O)O") == "" and murcko_scaffold(mols[7]) == "c1ccc2ccccc2c1"
    with pytest.raises(MoleculeFormatError):
        scaffold_split(["C1CC"])


@pytest.mark.skipif(find_data("esol") is None, reason="the ESOL data is not present")
def test_real_esol() -> None:
    data = load_esol()
    assert len(data) == 1128 and data.skipped == ()
    assert sum(m.n_atoms for m in data) == 14991
    assert all(torch.isfinite(m.atom_features).all() for m in data)
    assert all(m.mask.all() and -11.7 < m.label.item() < 1.6 for m in data)
    train, valid, test = scaffold_split(data)
    assert (len(train), len(valid) + len(test)) == (902, 226)
    in_train = {murcko_scaffold(m) for m in train}
    assert not in_train & {murcko_scaffold(m) for m in valid + test}


def test_scaffold_split_cuts_as_deepchem_does() -> None:
    """Cut-offs were rounded (7 items: train up to round(5.6) = 6) where DeepChem compares
    with 5.6 itself: a scaffold group went to train that DeepChem sends to validation."""
    smiles = ["CCO"] * 3 + ["c1ccccc1O"] * 2 + ["C1CCCCC1", "C1CC1"]
    train, valid, test = scaffold_split(smiles)
    assert (len(train), len(valid), len(test)) == (5, 1, 1)
    assert sorted(valid + test) == ["C1CC1", "C1CCCCC1"]
