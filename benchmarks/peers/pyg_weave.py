"""The Weave model of ``batchfold.models.weave`` written in PyTorch Geometric (CPU), timed.

Runs inside PyG's virtual environment (``benchmarks/.peers/pyg``, made by
``benchmarks/setup_peers.sh``: torch_geometric 2.8.1, torch 2.13 CPU, without the optional
torch_scatter / torch_sparse extensions); it needs ``torch_geometric``, ``torch`` and NumPy,
not batchfold. ``benchmarks/bench_weave.py`` writes its two input files and runs it.

Input files
-----------

The same as ``dgllife_weave.py``'s (its docstring has the formats): a molecule file
(``atom_features``, ``atom_offsets``, ``pair_features``, ``pair_index``, ``pair_offsets``,
``target``) and the weights of batchfold's ``WeaveModel`` under their ``state_dict`` names,
with ``config`` (``n_modules``, ``atom_dim``, ``pair_dim``, ``gather``, ``atom_features``,
``pair_features``).

The model
---------

Each molecule is a ``torch_geometric.data.Data``: one node per atom (``x``, the atom
features), one edge per ordered atom pair in the molecule's pair order (``edge_attr``, the
pair features), and the target as ``y`` (``[1, n_tasks]``, so that a batch stacks them). The
edge of pair ``(i, j)`` runs from ``j`` to ``i`` (``edge_index[:, k] = (j, i)``): PyG sums
messages at an edge's target, and batchfold's P->A sums the pairs whose *first* atom it is.

The modules are written here as a PyG user would, with batchfold's parameter names and
shapes, so that ``load_state_dict`` takes batchfold's weights as they are and the function
is batchfold's (no reparametrisation; the same gradients for the same parameters). With
``f`` the ReLU and ``[a; b]`` a concatenation, a module computes, per atom ``i`` and per
pair ``(i, j)``:

* A->A ``f(W_aa A_i + b_aa)`` and P->A ``sum f(W_pa P_ij + b_pa)`` over the edges into ``i``
  (``torch_geometric.utils.scatter``, ``reduce="sum"``); the new atom state
  ``f(W_a [A->A; P->A] + b_a)``;
* A->P from per-atom halves, as batchfold computes it: with ``W_ap = [W_1 W_2]``,
  ``L = W_1 A + b_ap`` and ``R = W_2 A`` once per atom, then per pair
  ``f(L_i + R_j) + f(L_j + R_i)`` (which is ``f(W_ap [A_i; A_j] + b) + f(W_ap [A_j; A_i] +
  b)``); P->P ``f(W_pp P_ij + b_pp)``; the new pair state ``f(W_p [A->P; P->P] + b_p)``;
* the last module computes the atoms only (batchfold's has no pair layers).

Then ``tanh(W A_i)`` (or its 11-bin Gaussian histogram) summed over each graph's atoms
(``torch_geometric.nn.global_add_pool``), and ``output(relu(hidden_layer(x)))``. The loss is
the summed squared error against ``y``.
``build_model`` and ``molecule_data`` make the model and a molecule's ``Data``;
``pyg_weave_train.py`` imports them to train the model to accuracy.

Timing
------

As ``dgllife_weave.py``: one JSON line per batch size and mode (``"system": "pyg"``), with
the same fields. Modes: ``prebuilt`` (``Batch.from_data_list`` of each batch before timing,
as a data loader would) and ``inloop`` (``Batch.from_data_list`` of the per-molecule
``Data``, which also stacks the targets, inside every timed step). The per-molecule ``Data``
are made before timing in both. A training step is forward, loss, backward and a plain SGD
step (``--lr``); inference is forward and loss under ``torch.no_grad``. With ``--loss-only``
it prints the summed loss of all the molecules at the weights read, and after one SGD step on
all of them (``loss``, ``loss_after_step``).

Usage::

    python pyg_weave.py MOLECULES.npz --weights W.npz [--batch-sizes 64,256]
        [--modes prebuilt,inloop] [--repeats 3] [--warmup 1] [--threads 2] [--lr 1e-4]
        [--no-train] [--no-infer] [--loss-only] [--serve]

With ``--serve`` it loads, then times one pass per JSON command read from standard input
(``weave_io.serve``), for a benchmark that times every system in turns.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # weave_io beside this file

from weave_io import (  # noqa: E402
    load_molecules,
    load_weights,
    parse_args,
    start_torch,
    time_modes,
)


def build_model(config, weights):
    """The Weave model in PyG (see the docstring) holding ``weights``, batchfold's tensors.

    Its ``predict(batch)`` gives the predictions ``[graphs, n_tasks]``; calling it on a batch
    gives the summed squared error against ``batch.y``.
    """
    import torch
    from torch import nn
    from torch.nn import functional as F
    from torch_geometric.nn import global_add_pool
    from torch_geometric.utils import scatter

    n_modules, atom_dim, pair_dim = config["n_modules"], config["atom_dim"], config["pair_dim"]

    class WeaveLayer(nn.Module):
        """One weave module on a (batched) graph; batchfold's parameter names and shapes."""

        def __init__(self, atom_in, pair_in, update_pairs):
            super().__init__()
            self.atom_in, self.update_pairs = atom_in, update_pairs
            self.atom_to_atom_layer = nn.Linear(atom_in, atom_dim)
            self.pair_to_atom_layer = nn.Linear(pair_in, atom_dim)
            self.atom_layer = nn.Linear(2 * atom_dim, atom_dim)
            if update_pairs:
                self.atom_to_pair_layer = nn.Linear(2 * atom_in, pair_dim)
                self.pair_to_pair_layer = nn.Linear(pair_in, pair_dim)
                self.pair_layer = nn.Linear(2 * pair_dim, pair_dim)

        def forward(self, x, edge_index, edge_attr):
            source, target = edge_index  # pair (i, j) is the edge j -> i
            a_to_a = torch.relu(self.atom_to_atom_layer(x))
            p_to_a = scatter(
                torch.relu(self.pair_to_atom_layer(edge_attr)),
                target,
                dim=0,
                dim_size=x.size(0),
                reduce="sum",
            )
            atoms = torch.relu(self.atom_layer(torch.cat([a_to_a, p_to_a], dim=-1)))
            if not self.update_pairs:
                return atoms, None
            w_1, w_2 = self.atom_to_pair_layer.weight.split(self.atom_in, dim=1)
            left = F.linear(x, w_1, self.atom_to_pair_layer.bias)  # [n_atoms, pair]
            right = F.linear(x, w_2)
            a_to_p = torch.relu(left[target] + right[source])
            a_to_p = a_to_p + torch.relu(left[source] + right[target])
            p_to_p = torch.relu(self.pair_to_pair_layer(edge_attr))
            pairs = torch.relu(self.pair_layer(torch.cat([a_to_p, p_to_p], dim=-1)))
            return atoms, pairs

    class Weave(nn.Module):
        """The weave modules, the gather and the head; the loss of a batch."""

        def __init__(self):
            super().__init__()
            sizes = [(config["atom_features"], config["pair_features"])]
            sizes += [(atom_dim, pair_dim)] * (n_modules - 1)
            self.weave = nn.ModuleList(
                WeaveLayer(a, p, update_pairs=k < n_modules - 1) for k, (a, p) in enumerate(sizes)
            )
            self.atom_readout = nn.Linear(*weights["atom_readout.weight"].shape[::-1])
            self.hidden_layer = nn.Linear(*weights["hidden_layer.weight"].shape[::-1])
            self.output = nn.Linear(*weights["output.weight"].shape[::-1])
            self.gaussian = config["gather"] == "gaussian"
            # kept out of the state_dict, so that it has batchfold's names and no others
            mean = torch.tensor([m for m, _ in config["gaussian_memberships"]])
            std = torch.tensor([s for _, s in config["gaussian_memberships"]])
            self.register_buffer("mean", mean, persistent=False)
            self.register_buffer("std", std, persistent=False)

        def predict(self, batch):
            """The predictions of a batch's graphs, ``[graphs, n_tasks]``."""
            x, pairs = batch.x, batch.edge_attr
            for layer in self.weave:
                x, new_pairs = layer(x, batch.edge_index, pairs)
                if new_pairs is not None:
                    pairs = new_pairs
            r = torch.tanh(self.atom_readout(x))
            if self.gaussian:
                w = torch.exp(-0.5 * ((r.unsqueeze(-1) - self.mean) / self.std) ** 2)
                r = (w / w.sum(dim=-1, keepdim=True)).flatten(-2)
            molecule = global_add_pool(r, batch.batch, size=batch.num_graphs)
            return self.output(torch.relu(self.hidden_layer(molecule)))

        def forward(self, batch):
            return (self.predict(batch) - batch.y).pow(2).sum()

    model = Weave()
    model.load_state_dict(weights)
    return model


def molecule_data(atoms, pairs, index, target):
    """One molecule's ``Data``: an edge per ordered pair (i, j), from j to i."""
    import torch
    from torch_geometric.data import Data

    index = torch.from_numpy(index.copy())
    return Data(
        x=torch.from_numpy(atoms.copy()),
        edge_index=torch.stack([index[:, 1], index[:, 0]]),
        edge_attr=torch.from_numpy(pairs.copy()),
        y=torch.from_numpy(target.copy()).unsqueeze(0),
    )


def import_pyg():
    """``(Batch, versions)`` of PyTorch Geometric, or None after saying how to install it."""
    try:
        import torch
        import torch_geometric
        from torch_geometric.data import Batch
    except ImportError as error:
        print(
            f"torch_geometric is not installed ({error}); run bash benchmarks/setup_peers.sh",
            file=sys.stderr,
        )
        return None
    return Batch, f"torch_geometric {torch_geometric.__version__}, torch {torch.__version__}"


def main(argv=None) -> int:
    """Load, check the options, then print the loss or the timings (see the docstring)."""
    args = parse_args(__doc__, argv)
    torch = start_torch(args.threads)
    found = import_pyg()
    if found is None:
        return 1
    Batch, version = found

    config, arrays = load_weights(args.weights)
    weights = {k: torch.from_numpy(v) for k, v in arrays.items()}
    graphs = [molecule_data(*m) for m in load_molecules(args.molecules)]
    model = build_model(config, weights)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)

    def train_step(batch):
        opt.zero_grad(set_to_none=True)
        loss = model(batch)
        loss.backward()
        opt.step()
        return loss.item()

    def infer_step(batch):
        with torch.no_grad():
            return model(batch).item()

    if args.loss_only:
        every = Batch.from_data_list(graphs)
        before = infer_step(every)
        train_step(every)
        after = infer_step(every)
        line = {"system": "pyg", "loss": before, "loss_after_step": after, "lr": args.lr}
        print(json.dumps({**line, "version": version}), flush=True)
        return 0

    def batches(mode, spans):
        items = [[graphs[i] for i in s] for s in spans]
        if mode == "prebuilt":
            return [Batch.from_data_list(s) for s in items], lambda item: item
        return items, Batch.from_data_list

    time_modes(args, "pyg", version, len(graphs), batches, train_step, infer_step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
