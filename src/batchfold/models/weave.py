"""Weave graph convolutions (Kearnes et al. 2016) for molecules, as per-molecule PyTorch code.

Kearnes, McCloskey, Berndl, Pande and Riley, "Molecular graph convolutions: moving beyond
fingerprints" (J. Comput. Aided Mol. Des. 2016) keep a state per atom ``A_i`` and per
ordered atom pair ``P_ij``. A weave module (:class:`WeaveLayer`) updates both from both::

    A->A:  f(W_aa A_i)                      P->A:  sum over pairs (i, j) of f(W_pa P_ij)
    A_i' = f(W_a [A->A; P->A])
    A->P:  f(W_ap [A_i; A_j]) + f(W_ap [A_j; A_i])   (the same for (i, j) and (j, i))
    P->P:  f(W_pp P_ij)
    P_ij' = f(W_p [A->P; P->P])

with ``f`` the ReLU. :class:`WeaveModel` stacks modules (2 by default; the last one skips
the pair update, whose output nothing reads), maps every atom through ``tanh(W A_i)``,
gathers the molecule by summing atoms (or, with ``gather="gaussian"``, the paper's fuzzy
histogram, :func:`gaussian_histogram`) and predicts with a small MLP. The paper's batch
normalisation is left out: it would tie a molecule's output to the rest of its batch.

Every method works on one record (``[d]``) and on a stack of records (``[n, d]``) alike,
so the same weights serve :func:`weave_predict` (one molecule's whole tensors, eager or
through ``batchfold.batch_map``) and the blocks model of
:mod:`batchfold.models.weave_blocks` (one node per atom or pair record).
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from batchfold.data.molecule_features import ATOM_FEATURES, PAIR_FEATURES, Molecule

__all__ = [
    "GAUSSIAN_MEMBERSHIPS",
    "WeaveLayer",
    "WeaveModel",
    "gaussian_histogram",
    "weave_predict",
]

GAUSSIAN_MEMBERSHIPS = (
    (-1.645, 0.283),
    (-1.080, 0.170),
    (-0.739, 0.134),
    (-0.468, 0.118),
    (-0.228, 0.114),
    (0.0, 0.114),
    (0.228, 0.114),
    (0.468, 0.118),
    (0.739, 0.134),
    (1.080, 0.170),
    (1.645, 0.283),
)
"""``(mean, standard deviation)`` of the 11 Gaussians of the fuzzy histogram (Kearnes et al.,
as in DeepChem's ``WeaveGather``): the deciles of a standard normal distribution."""


def gaussian_histogram(x: Tensor) -> Tensor:
    """Kearnes et al.'s fuzzy histogram: each value's membership in 11 Gaussian bins.

    Each value ``x`` gets ``exp(-(x - mu_k)^2 / (2 sigma_k^2))`` for the 11 bins of
    :data:`GAUSSIAN_MEMBERSHIPS`, normalised to sum to 1 over the bins. Summed over a
    molecule's atoms, this is a histogram of every feature.

    Arguments:
        x: values, ``[..., d]``.

    Returns:
        ``[..., 11 * d]``: the 11 memberships of feature 0, then of feature 1, ...

    Example:
        >>> h = gaussian_histogram(torch.tensor([0.0, 2.0]))
        >>> h.shape, h[:11].argmax().item(), h[11:].argmax().item(), round(h[:11].sum().item(), 6)
        (torch.Size([22]), 5, 10, 1.0)
    """
    # torch.tensor rather than x.new_tensor: batch_map's lazy tensors have no new_tensor
    mean = torch.tensor([m for m, _ in GAUSSIAN_MEMBERSHIPS], dtype=x.dtype, device=x.device)
    std = torch.tensor([s for _, s in GAUSSIAN_MEMBERSHIPS], dtype=x.dtype, device=x.device)
    weight = torch.exp(-0.5 * ((x.unsqueeze(-1) - mean) / std) ** 2)  # [..., d, 11]
    weight = weight / weight.sum(dim=-1, keepdim=True)
    return weight.flatten(-2)


def _pair_sum(per_pair: Tensor, atom_of_pair: Tensor, like: Tensor) -> Tensor:
    """``out[i] = sum of per_pair[k] over the pairs k whose first atom is i``: shaped ``like``
    ``[n_atoms, d]`` (made from it, not from its length, so that ``batch_map`` can batch
    molecules of any size as one call)."""
    return torch.zeros_like(like).index_add(0, atom_of_pair, per_pair)


class WeaveLayer(nn.Module):
    """One weave module: atoms from atoms and pairs, and pairs from atoms and pairs.

    The equations are in the module docstring. :meth:`forward` runs the whole module on one
    molecule; the other methods are its parts, each on records with any leading dimensions.

    Arguments:
        atom_in: the size of an atom's input state.
        pair_in: the size of a pair's input state.
        atom_out: the size of the new atom state (and of A->A and P->A).
        pair_out: the size of the new pair state (and of A->P and P->P).
        update_pairs: compute new pair states; the last module of a model does not need them.

    Example:
        >>> layer = WeaveLayer(3, 2, 4, 5)
        >>> atoms, pairs = torch.randn(3, 3), torch.randn(6, 2)
        >>> index = torch.tensor([[0, 1], [0, 2], [1, 0], [1, 2], [2, 0], [2, 1]])
        >>> a, p = layer(atoms, pairs, index)
        >>> tuple(a.shape), tuple(p.shape)
        ((3, 4), (6, 5))
    """

    def __init__(
        self, atom_in: int, pair_in: int, atom_out: int, pair_out: int, update_pairs: bool = True
    ) -> None:
        super().__init__()
        self.atom_out, self.pair_out, self.update_pairs = atom_out, pair_out, update_pairs
        self.atom_to_atom_layer = nn.Linear(atom_in, atom_out)
        self.pair_to_atom_layer = nn.Linear(pair_in, atom_out)
        self.atom_layer = nn.Linear(2 * atom_out, atom_out)
        if update_pairs:
            self.atom_to_pair_layer = nn.Linear(2 * atom_in, pair_out)
            self.pair_to_pair_layer = nn.Linear(pair_in, pair_out)
            self.pair_layer = nn.Linear(2 * pair_out, pair_out)

    def atom_to_atom(self, atom: Tensor) -> Tensor:
        """A->A of atom states ``[..., atom_in]``: ``[..., atom_out]``."""
        return torch.relu(self.atom_to_atom_layer(atom))

    def pair_to_atom(self, pair: Tensor) -> Tensor:
        """One pair's term of P->A, before the sum over an atom's pairs: ``[..., atom_out]``."""
        return torch.relu(self.pair_to_atom_layer(pair))

    def combine_atom(self, a_to_a: Tensor, p_to_a: Tensor) -> Tensor:
        """The new atom state from A->A and the summed P->A: ``[..., atom_out]``."""
        return torch.relu(self.atom_layer(torch.cat([a_to_a, p_to_a], dim=-1)))

    def update_pair(self, atom_i: Tensor, atom_j: Tensor, pair: Tensor) -> Tensor:
        """The new state of pair ``(i, j)`` from its atoms' states and its own: ``[..., pair_out]``.

        Arguments:
            atom_i: the first atom's state, ``[..., atom_in]``.
            atom_j: the second atom's state, ``[..., atom_in]``.
            pair: the pair's state, ``[..., pair_in]``.
        """
        if not self.update_pairs:
            raise ValueError("this weave module was made with update_pairs=False")
        a_to_p = torch.relu(self.atom_to_pair_layer(torch.cat([atom_i, atom_j], dim=-1)))
        a_to_p = a_to_p + torch.relu(self.atom_to_pair_layer(torch.cat([atom_j, atom_i], dim=-1)))
        return self._new_pair(a_to_p, pair)

    def atom_to_pair(self, atoms: Tensor, first: Tensor, second: Tensor) -> Tensor:
        """A->P of every pair of one molecule, from its atom states ``[n_atoms, atom_in]`` and
        the pairs' atoms ``first``, ``second`` (``[n_pairs]``): ``[n_pairs, pair_out]``.

        The value of :meth:`update_pair`'s A->P, computed as DGL-LifeSci's Weave layer does:
        with ``W_ap = [W_1 W_2]``, ``W_1 A + b`` and ``W_2 A`` once per atom, then added per
        pair, instead of the layer on each pair's ``2 x atom_in`` inputs (a molecule has
        about as many pairs as atoms squared).
        """
        if not self.update_pairs:
            raise ValueError("this weave module was made with update_pairs=False")
        zeros = torch.zeros_like(atoms)
        left = self.atom_to_pair_layer(torch.cat([atoms, zeros], dim=-1))  # W_1 A + b
        right = F.linear(torch.cat([zeros, atoms], dim=-1), self.atom_to_pair_layer.weight)
        forward = left.index_select(0, first) + right.index_select(0, second)
        backward = left.index_select(0, second) + right.index_select(0, first)
        return torch.relu(forward) + torch.relu(backward)

    def _new_pair(self, a_to_p: Tensor, pair: Tensor) -> Tensor:
        p_to_p = torch.relu(self.pair_to_pair_layer(pair))
        return torch.relu(self.pair_layer(torch.cat([a_to_p, p_to_p], dim=-1)))

    def forward(
        self, atoms: Tensor, pairs: Tensor, pair_index: Tensor
    ) -> tuple[Tensor, Tensor | None]:
        """The module on one molecule's whole tensors.

        Arguments:
            atoms: atom states, ``[n_atoms, atom_in]``.
            pairs: pair states, ``[n_pairs, pair_in]``.
            pair_index: the atoms ``(i, j)`` of each pair, ``[n_pairs, 2]`` (int64).

        Returns:
            The new atom states ``[n_atoms, atom_out]`` and pair states ``[n_pairs,
            pair_out]`` (``None`` without ``update_pairs``).
        """
        first, second = pair_index[:, 0], pair_index[:, 1]
        a_to_a = self.atom_to_atom(atoms)
        p_to_a = _pair_sum(self.pair_to_atom(pairs), first, a_to_a)
        new_atoms = self.combine_atom(a_to_a, p_to_a)
        if not self.update_pairs:
            return new_atoms, None
        return new_atoms, self._new_pair(self.atom_to_pair(atoms, first, second), pairs)


class WeaveModel(nn.Module):
    """Weave modules, a molecule-level gather and an MLP: one prediction vector per molecule.

    Arguments:
        n_tasks: the size of the prediction (1 for a regression, 12 logits for Tox21).
        atom_dim: the atom state size of every weave module.
        pair_dim: the pair state size of every weave module.
        n_modules: how many weave modules to stack (at least 1).
        gather_dim: the size of each atom's ``tanh`` layer before the gather.
        hidden: the size of the MLP's hidden layer.
        gather: ``"sum"`` (sum the atoms) or ``"gaussian"`` (sum their fuzzy histograms,
            ``11 * gather_dim`` features).
        dropout: dropout after the MLP's hidden layer while training (DeepChem's Weave
            model uses 0.25 in its dense layers); 0 leaves it out.
        atom_features: the size of the input atom features.
        pair_features: the size of the input pair features.

    Example:
        >>> from batchfold.data.molecules import featurize
        >>> model = WeaveModel(n_tasks=2, atom_dim=8, pair_dim=8, gather_dim=6, hidden=5)
        >>> weave_predict(model, featurize("CCO")).shape
        torch.Size([2])
    """

    def __init__(
        self,
        n_tasks: int = 1,
        atom_dim: int = 50,
        pair_dim: int = 50,
        n_modules: int = 2,
        gather_dim: int = 128,
        hidden: int = 128,
        gather: str = "sum",
        atom_features: int = ATOM_FEATURES,
        pair_features: int = PAIR_FEATURES,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if n_modules < 1:
            raise ValueError(f"a weave model needs at least 1 weave module, got {n_modules}")
        if gather not in ("sum", "gaussian"):
            raise ValueError(f"gather must be 'sum' or 'gaussian', got {gather!r}")
        self.gather = gather
        self.atom_features, self.pair_features = atom_features, pair_features
        sizes = [(atom_features, pair_features)] + [(atom_dim, pair_dim)] * (n_modules - 1)
        self.weave = nn.ModuleList(
            WeaveLayer(a, p, atom_dim, pair_dim, update_pairs=k < n_modules - 1)
            for k, (a, p) in enumerate(sizes)
        )
        self.atom_readout = nn.Linear(atom_dim, gather_dim)
        molecule_dim = gather_dim * (len(GAUSSIAN_MEMBERSHIPS) if gather == "gaussian" else 1)
        self.hidden_layer = nn.Linear(molecule_dim, hidden)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.output = nn.Linear(hidden, n_tasks)

    @property
    def layers(self) -> list[WeaveLayer]:
        """The weave modules, first to last."""
        return [cast(WeaveLayer, layer) for layer in self.weave]

    def readout(self, atom: Tensor) -> Tensor:
        """An atom's term of the molecule-level gather: ``tanh(W A)``, histogrammed if asked."""
        x = torch.tanh(self.atom_readout(atom))
        return gaussian_histogram(x) if self.gather == "gaussian" else x

    def head(self, molecule: Tensor) -> Tensor:
        """The prediction from the gathered molecule vector: ``[..., n_tasks]``."""
        return self.output(self.dropout(torch.relu(self.hidden_layer(molecule))))

    def forward(self, atoms: Tensor, pairs: Tensor, pair_index: Tensor) -> Tensor:
        """The prediction for one molecule from its whole feature tensors.

        Arguments:
            atoms: atom features, ``[n_atoms, atom_features]``.
            pairs: pair features, ``[n_pairs, pair_features]``.
            pair_index: the atoms of each pair, ``[n_pairs, 2]`` (int64).

        Returns:
            ``[n_tasks]``.
        """
        for layer in self.layers:
            atoms, new_pairs = layer(atoms, pairs, pair_index)
            if new_pairs is not None:
                pairs = new_pairs
        return self.head(self.readout(atoms).sum(dim=0))


def weave_predict(model: WeaveModel, molecule: Molecule) -> Tensor:
    """One molecule's prediction: plain single-instance code for ``batchfold.batch_map``.

    The molecule's tensors are made per-instance constants (``torch.as_tensor``, in the
    model's dtype and on its device), so inside ``batch_map`` every op on them is recorded;
    eagerly it is just the model on one molecule.

    Arguments:
        model: the weave model.
        molecule: a featurized molecule.

    Returns:
        ``[n_tasks]``.

    Example:
        >>> import batchfold as bf
        >>> from batchfold.data.molecules import featurize
        >>> _ = torch.manual_seed(0)
        >>> model = WeaveModel(atom_dim=6, pair_dim=6, gather_dim=4, hidden=4)
        >>> molecules = [featurize(s) for s in ("CCO", "CCN", "C")]
        >>> batched = bf.batch_map(lambda m: weave_predict(model, m), molecules)
        >>> all(torch.allclose(b, weave_predict(model, m)) for b, m in zip(batched, molecules))
        True
    """
    weight = model.output.weight
    dtype, device = weight.dtype, weight.device
    atoms = torch.as_tensor(molecule.atom_features, dtype=dtype, device=device)
    pairs = torch.as_tensor(molecule.pair_features, dtype=dtype, device=device)
    index = torch.as_tensor(molecule.pair_index, device=device)
    return model(atoms, pairs, index)
