"""The Weave model of :mod:`batchfold.models.weave` written as blocks, over atom and pair records.

As in TensorFlow Fold, a molecule is a Python structure of records, and the model is
built from typed combinators on them (:func:`atom_records` makes the structure):

- a molecule is a sequence of atom records ``(A_i, pairs_i)``;
- ``pairs_i`` is the sequence of pair records ``(P_ij, j)`` of the pairs whose first atom
  is ``i``, each carrying the index ``j`` of its other atom as a Python int.

A weave module (:func:`weave_module`) is then a ``Map`` over atom records:

- A->A is a ``Function`` on ``A_i``;
- P->A is ``Map(GetItem(0) >> Function(pair_to_atom)) >> Sum()`` over ``pairs_i``:
  keeping each atom's pairs inside its record is what makes the paper's sum over pairs a
  plain ``Sum``, where a flat list of pairs would need a scatter that blocks do not have;
- A->P needs the other atom's state ``A_j``: the atom states go to every atom record
  with ``Broadcast`` and ``Zip``, and ``Nth`` picks ``A_j`` by the pair's ``j``;
- the new pair keeps its ``j``, so the next module reads the same structure.

Each ``Function`` wraps one method of the :class:`~batchfold.models.weave.WeaveLayer`, so
the blocks share their weights with :func:`~batchfold.models.weave.weave_predict`, and a
call is one graph node per atom or pair record, run batched over every molecule of the
batch whatever its size. No ``Function`` takes a whole molecule's tensors: a block's
per-instance shapes are fixed, and molecules differ in size.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from batchfold.blocks import (
    Block,
    Broadcast,
    Composition,
    Function,
    GetItem,
    Identity,
    InputTransform,
    Map,
    Nth,
    Record,
    Sum,
    Vector,
    Zip,
)
from batchfold.data.molecule_features import Molecule
from batchfold.models.weave import WeaveLayer, WeaveModel

__all__ = ["AtomRecord", "atom_records", "weave_blocks", "weave_module"]

AtomRecord = tuple[Tensor, list[tuple[Tensor, int]]]
"""``(atom features, [(pair features, other atom), ...])`` of one atom."""


def atom_records(molecule: Molecule) -> list[AtomRecord]:
    """A molecule as atom records: each atom's features with its pairs' features and partners.

    Arguments:
        molecule: a featurized molecule.

    Returns:
        One ``(atom_features[i], [(pair_features[k], j), ...])`` per atom ``i``, listing
        the pairs ``k = (i, j)`` in the molecule's pair order.

    Example:
        >>> from batchfold.data.molecules import featurize
        >>> records = atom_records(featurize("CO"))
        >>> [(tuple(a.shape), [(tuple(p.shape), j) for p, j in pairs]) for a, pairs in records]
        [((27,), [((12,), 1)]), ((27,), [((12,), 0)])]
    """
    pairs: list[list[tuple[Tensor, int]]] = [[] for _ in range(molecule.n_atoms)]
    for (i, j), features in zip(
        molecule.pair_index.tolist(), molecule.pair_features.unbind(0), strict=True
    ):
        pairs[i].append((features, j))
    return list(zip(molecule.atom_features.unbind(0), pairs, strict=True))


def weave_module(layer: WeaveLayer) -> Block:
    """One weave module as a block on a molecule's atom records.

    Arguments:
        layer: the module whose weights to use.

    Returns:
        A block from ``[(A_i, [(P_ij, j), ...]), ...]`` to the same structure with the new
        states, or, when the layer does not update pairs, to the new atom states ``[A_i']``.
    """
    a_to_a = Function(layer.atom_to_atom, name="atom_to_atom")
    p_to_a = Map(GetItem(0) >> Function(layer.pair_to_atom, name="pair_to_atom")) >> Sum()
    combine = Function(layer.combine_atom, name="combine_atom")

    def pair(x: Any) -> Any:  # (A_i, all atom states, (P_ij, j))
        atom_j = Nth().reads(x[1], x[2][1])
        new = Function(layer.update_pair, name="update_pair").reads(x[0], atom_j, x[2][0])
        return new, x[2][1]

    pair_step = Composition(pair, name="weave_pair")

    def atom(x: Any) -> Any:  # ((A_i, pairs_i), all atom states)
        state, pairs, everyone = x[0][0], x[0][1], x[1]
        new_atom = combine.reads(a_to_a.reads(state), p_to_a.reads(pairs))
        if not layer.update_pairs:
            return new_atom
        context = (Record((Broadcast(), Broadcast(), Identity())) >> Zip()).reads(
            state, everyone, pairs
        )
        return new_atom, Map(pair_step).reads(context)

    atom_step = Composition(atom, name="weave_atom")

    def molecule(records: Any) -> Any:
        states = Map(GetItem(0)).reads(records)
        return (Record((Identity(), Broadcast())) >> Zip() >> Map(atom_step)).reads(records, states)

    return Composition(molecule, name="weave_module")


def weave_blocks(model: WeaveModel) -> Block:
    """The weave model as a block on one :class:`~batchfold.data.molecules.Molecule`.

    Arguments:
        model: the model whose weights to use; the blocks read its dtype.

    Returns:
        A block giving the molecule's prediction ``[n_tasks]``; compile it with
        ``batchfold.blocks.compile``.

    Example:
        >>> import torch
        >>> from batchfold.blocks import compile
        >>> from batchfold.data.molecules import featurize
        >>> from batchfold.models.weave import weave_predict
        >>> _ = torch.manual_seed(0)
        >>> model = WeaveModel(n_tasks=2, atom_dim=6, pair_dim=6, gather_dim=4, hidden=4)
        >>> molecules = [featurize(s) for s in ("CCO", "c1ccccc1", "C")]
        >>> predictions, _ = compile(weave_blocks(model))(molecules)
        >>> want = torch.stack([weave_predict(model, m) for m in molecules])
        >>> predictions.shape, torch.allclose(predictions, want, atol=1e-6)
        (torch.Size([3, 2]), True)
    """
    dtype = model.output.weight.dtype
    pair = Record((Vector(model.pair_features, dtype), Identity()))
    inputs = Map(Record((Vector(model.atom_features, dtype), Map(pair))))
    block: Block = InputTransform(atom_records, name="atom_records") >> inputs
    for layer in model.layers:
        block = block >> weave_module(layer)
    readout = Function(model.readout, name="readout")
    return block >> Map(readout) >> Sum() >> Function(model.head, name="head")
