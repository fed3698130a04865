"""Weave as blocks, through batch_map and eagerly: the same values and gradients."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

import batchfold as bf
from batchfold.blocks import compile
from batchfold.data.molecules import Molecule, featurize
from batchfold.models.weave import (
    GAUSSIAN_MEMBERSHIPS,
    WeaveLayer,
    WeaveModel,
    gaussian_histogram,
    weave_predict,
)
from batchfold.models.weave_blocks import atom_records, weave_blocks
from batchfold.schedule import Scheduler
from random_molecules import random_molecule

pytestmark = pytest.mark.usefixtures("float64")

SMILES = ["C", "CCO", "c1ccccc1O", "CC(=O)[O-].[Na+]", "N#Cc1ccncc1", "ClC(Cl)Cl", "O"]


def molecules(seed: int = 0) -> list[Molecule]:
    rng = random.Random(seed)
    made = [random_molecule(rng, rng.randint(1, 7), all_pairs=rng.random() < 0.6) for _ in range(9)]
    made += [random_molecule(rng, 4)] * 2  # two molecules of one size: batch_map batches them
    return made + [featurize(s) for s in SMILES]


def model(seed: int = 0, **options: Any) -> WeaveModel:
    torch.manual_seed(seed)
    sizes: dict[str, Any] = {"atom_dim": 6, "pair_dim": 5, "gather_dim": 4, "hidden": 3}
    return WeaveModel(n_tasks=2, **{**sizes, **options})


def eager(weave: WeaveModel, batch: list[Molecule]) -> torch.Tensor:
    return torch.stack([weave_predict(weave, m) for m in batch])


def blocks(
    weave: WeaveModel, batch: list[Molecule], scheduler: Scheduler = "agenda"
) -> torch.Tensor:
    predictions, _ = compile(weave_blocks(weave), scheduler=scheduler)(batch)
    return predictions


def lazy(weave: WeaveModel, batch: list[Molecule]) -> torch.Tensor:
    return torch.stack(bf.batch_map(lambda m: weave_predict(weave, m), batch))


def assert_same_values_and_gradients(weave: WeaveModel, got: torch.Tensor, want: torch.Tensor):
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    weights = torch.randn_like(want)  # a loss that weighs every output differently
    params = list(weave.parameters())
    got_grads = torch.autograd.grad((got * weights).sum(), params, allow_unused=True)
    want_grads = torch.autograd.grad((want * weights).sum(), params, allow_unused=True)
    for g, w in zip(got_grads, want_grads, strict=True):
        assert (g is None) == (w is None)
        if g is not None and w is not None:
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.usefixtures("walks")
@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
@pytest.mark.parametrize(
    "options",
    [{}, {"gather": "gaussian"}, {"n_modules": 1}, {"n_modules": 3, "gather": "gaussian"}],
)
def test_blocks_equal_eager(scheduler: Scheduler, options: dict[str, Any]):
    weave = model(**options)
    batch = molecules()
    assert_same_values_and_gradients(weave, blocks(weave, batch, scheduler), eager(weave, batch))


@pytest.mark.parametrize("options", [{}, {"gather": "gaussian", "n_modules": 3}])
def test_batch_map_equals_eager(options: dict[str, Any]):
    weave = model(seed=1, **options)
    batch = molecules(seed=1)
    assert_same_values_and_gradients(weave, lazy(weave, batch), eager(weave, batch))


def test_molecules_without_pairs_take_the_cached_call():
    # methane and water have one atom and no pair; a sum over no pairs is zeros, as eagerly
    weave = model(seed=3)
    batch = [featurize(s) for s in ["CCO", "c1ccccc1O", "C", "ClC(Cl)Cl", "O", "C"]]
    assert [len(m.pair_features) for m in batch] == [6, 42, 0, 12, 0, 0]
    got, stats = bf.batch_map(lambda m: weave_predict(weave, m), batch, return_stats=True)
    assert not stats.module_misses
    assert stats.module_calls_cached == len(batch) - 2  # the first two confirm the call
    assert_same_values_and_gradients(weave, torch.stack(got), eager(weave, batch))


def test_dropout_draws_per_molecule_in_training_only():
    weave = model(seed=4, dropout=0.5)
    assert isinstance(model(seed=4).dropout, torch.nn.Identity)
    batch = [featurize("c1ccccc1O")] * 4 + [featurize("CCO")]
    weave.eval()
    assert_same_values_and_gradients(weave, lazy(weave, batch), eager(weave, batch))
    weave.train()
    torch.manual_seed(0)
    got = lazy(weave, batch)
    assert len({tuple(row.tolist()) for row in got[:4]}) > 1  # one molecule, other masks


def test_blocks_equal_batch_map():
    weave = model(seed=2)
    batch = molecules(seed=2)
    assert_same_values_and_gradients(weave, blocks(weave, batch), lazy(weave, batch))


def test_weave_layer_by_hand():
    torch.manual_seed(3)
    layer = WeaveLayer(3, 2, 4, 5).double()
    atoms = torch.randn(3, 3)
    pair_index = torch.tensor([[0, 1], [0, 2], [1, 0], [2, 1]])  # atom 1 has one pair
    pairs = torch.randn(4, 2)
    new_atoms, new_pairs = layer(atoms, pairs, pair_index)
    assert new_pairs is not None
    relu = torch.relu
    for i in range(3):
        p_to_a = sum(
            (relu(layer.pair_to_atom_layer(pairs[k])) for k in range(4) if pair_index[k, 0] == i),
            torch.zeros(4),
        )
        a_to_a = relu(layer.atom_to_atom_layer(atoms[i]))
        want = relu(layer.atom_layer(torch.cat([a_to_a, p_to_a])))
        torch.testing.assert_close(new_atoms[i], want)
    for k, (i, j) in enumerate(pair_index.tolist()):
        ap = relu(layer.atom_to_pair_layer(torch.cat([atoms[i], atoms[j]])))
        pa = relu(layer.atom_to_pair_layer(torch.cat([atoms[j], atoms[i]])))
        pp = relu(layer.pair_to_pair_layer(pairs[k]))
        torch.testing.assert_close(new_pairs[k], relu(layer.pair_layer(torch.cat([ap + pa, pp]))))


def test_the_pair_update_is_symmetric_in_the_atoms():
    torch.manual_seed(4)
    layer = WeaveLayer(3, 2, 4, 5).double()
    a, b, p = torch.randn(3), torch.randn(3), torch.randn(2)
    torch.testing.assert_close(layer.update_pair(a, b, p), layer.update_pair(b, a, p))


def test_the_last_module_leaves_pairs_alone():
    weave = model(n_modules=2)
    assert [layer.update_pairs for layer in weave.layers] == [True, False]
    assert not hasattr(weave.layers[1], "pair_layer")
    with pytest.raises(ValueError, match="update_pairs=False"):
        weave.layers[1].update_pair(torch.zeros(6), torch.zeros(6), torch.zeros(5))


def test_gaussian_histogram_sums_to_one_per_feature():
    x = torch.linspace(-1, 1, 7).reshape(7, 1).expand(7, 3)
    h = gaussian_histogram(x)
    assert h.shape == (7, 33)
    torch.testing.assert_close(h.reshape(7, 3, 11).sum(-1), torch.ones(7, 3))
    means = torch.tensor([m for m, _ in GAUSSIAN_MEMBERSHIPS])
    nearest = (x[:, :1] - means).abs().argmin(-1)
    assert torch.equal(h.reshape(7, 3, 11)[:, 0].argmax(-1), nearest)


def test_atom_records_group_pairs_by_first_atom():
    rng = random.Random(5)
    m = random_molecule(rng, 5, all_pairs=False)
    records = atom_records(m)
    assert len(records) == 5
    seen = [(i, j) for i, (_, pairs) in enumerate(records) for _, j in pairs]
    assert sorted(seen) == sorted(map(tuple, m.pair_index.tolist()))
    for i, (atom, pairs) in enumerate(records):
        assert torch.equal(atom, m.atom_features[i])
        for features, j in pairs:
            k = m.pair_index.tolist().index([i, j])
            assert torch.equal(features, m.pair_features[k])


@pytest.mark.parametrize(
    ("options", "message"),
    [({"n_modules": 0}, "at least 1 weave module"), ({"gather": "max"}, "gather must be")],
)
def test_bad_options(options: dict[str, Any], message: str):
    with pytest.raises(ValueError, match=message):
        model(**options)
