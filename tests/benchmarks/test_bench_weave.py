"""The systems of benchmarks/bench_weave.py agree with the one-at-a-time loop, and its files.

benchmarks/ is not a package and is never collected; this test puts it on ``sys.path`` to
import the benchmark, as the benchmark scripts do when run from there.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_weave  # noqa: E402
from batchfold.data.molecules import featurize  # noqa: E402
from batchfold.models.weave import GAUSSIAN_MEMBERSHIPS, WeaveModel  # noqa: E402

SMILES = ("CCO", "c1ccccc1O", "CC(=O)N")


def _molecules():
    return [featurize(s, label=[0.5 * k - 0.3]) for k, s in enumerate(SMILES)]


def _model() -> WeaveModel:
    torch.manual_seed(0)
    return WeaveModel(atom_dim=6, pair_dim=5, gather_dim=4, hidden=3).double()


def test_systems_agree_with_the_loop():
    bench_weave.check_systems(_model(), _molecules())


def test_check_catches_a_wrong_system(monkeypatch):
    def skewed(model, batch):
        return bench_weave.squared_error(
            torch.stack([bench_weave.weave_predict(model, m) for m in batch]) * 1.001, batch
        )

    real = bench_weave.make_systems

    def systems(model):
        out = real(model)
        out["batchfold blocks"] = lambda batch: skewed(model, batch)
        return out

    monkeypatch.setattr(bench_weave, "make_systems", systems)
    with pytest.raises(RuntimeError, match="batchfold blocks"):
        bench_weave.check_systems(_model(), _molecules())


def test_peer_files(tmp_path):
    molecules = _molecules()
    data = np.load(bench_weave.write_molecules(molecules, tmp_path / "m.npz"))
    atoms, pairs = data["atom_offsets"], data["pair_offsets"]
    assert atoms.tolist() == [0, 3, 10, 14]
    for k, m in enumerate(molecules):
        index = data["pair_index"][pairs[k] : pairs[k + 1]]
        assert index.tolist() == m.pair_index.tolist()
        assert np.array_equal(data["atom_features"][atoms[k] : atoms[k + 1]], m.atom_features)
    assert data["target"][:, 0].tolist() == pytest.approx([-0.3, 0.2, 0.7])
    model = _model()
    stored = np.load(bench_weave.write_weights(model, tmp_path / "w.npz"))
    config = json.loads(str(stored["config"]))
    assert config == {
        "n_modules": 2,
        "atom_dim": 6,
        "pair_dim": 5,
        "gather": "sum",
        "atom_features": 27,
        "pair_features": 12,
        "gaussian_memberships": [list(bin) for bin in GAUSSIAN_MEMBERSHIPS],
    }
    assert set(stored.files) == {"config", *model.state_dict()}
    assert stored["weave.0.atom_to_pair_layer.weight"].dtype == np.float32
