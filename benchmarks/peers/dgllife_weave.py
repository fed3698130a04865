"""The Weave model of ``batchfold.models.weave`` on DGL-LifeSci's Weave layers (CPU), timed.

Runs inside DGL's virtual environment (``benchmarks/.peers/dgl``, made by
``benchmarks/setup_peers.sh``: DGL 1.1.3, dgllife 0.3.2, torch 2.13 CPU); it needs
``dgllife``, ``dgl``, ``torch`` and NumPy, not batchfold. ``benchmarks/bench_weave.py`` writes
its two input files and runs it.

Input files (NumPy ``.npz``)
----------------------------

Molecules (``MOLECULES.npz``), every molecule's arrays concatenated in file order:

* ``atom_features`` ``[total atoms, 27]`` float32 and ``atom_offsets`` ``[n + 1]`` int64:
  molecule ``m``'s atoms are rows ``atom_offsets[m]:atom_offsets[m + 1]``;
* ``pair_features`` ``[total pairs, 12]`` float32, ``pair_index`` ``[total pairs, 2]`` int64
  (atom numbers within the molecule) and ``pair_offsets`` ``[n + 1]`` int64, likewise: one
  row per ordered atom pair ``(i, j)``;
* ``target`` ``[n, n_tasks]`` float32: the regression target of each molecule.

Weights (``--weights W.npz``): every parameter of batchfold's ``WeaveModel`` under its
``state_dict`` name (``weave.0.atom_to_atom_layer.weight``, ..., ``output.bias``), float32,
and ``config``: a JSON string with ``n_modules``, ``atom_dim``, ``pair_dim``, ``gather``
(``"sum"`` or ``"gaussian"``), ``atom_features``, ``pair_features`` and
``gaussian_memberships`` (the ``(mean, sd)`` of each bin of the Gaussian gather).

The model
---------

Each molecule is a DGL graph with one node per atom and one edge per ordered atom pair, in
the molecule's pair order, with the pair features as edge features. The edge of pair
``(i, j)`` runs from ``j`` to ``i``: dgllife's P->A sums the messages of the edges coming
*into* an atom, and batchfold's sums the pairs whose *first* atom it is. The weave modules are
``dgllife.model.gnn.weave.WeaveLayer``, run by a ``dgllife.model.gnn.weave.WeaveGNN`` (the
last one with ``node_only=True``, so that it skips the pair update as batchfold's last module
does); they are built with batchfold's sizes (``WeaveGNN``'s own constructor gives every
module one size for atoms and pairs). On top, batchfold's readout and head written here:
``tanh(W A_i)`` (or its 11-bin Gaussian histogram), summed over each graph's atoms
(``dgl.readout_nodes``), then ``output(relu(hidden_layer(x)))``. The loss is the summed
squared error against ``target``.
``build_model`` and ``molecule_graph`` make the model and a molecule's graph;
``dgllife_weave_train.py`` imports them to train the model to accuracy.

How dgllife's ``WeaveLayer`` differs from batchfold's, and what is done about it (with these,
the two compute the same function, and the same gradients for batchfold's parameters):

* A->A, P->A and the new atom state are the same: ``f(W A_i)``, ``sum f(W P)`` over the edges
  into the atom, ``f(W [A->A; P->A])``, with ``f`` the ReLU; no batch normalisation in either.
* A->P: dgllife has two node layers, ``left_node_to_edge`` (``W_l``, ``b_l``) and
  ``right_node_to_edge`` (``W_r``, ``b_r``), computed once per atom, and per edge ``u -> v``
  ``first = f(W_l A_u + W_r A_v + b_l + b_r)`` and ``second = f(W_r A_u + W_l A_v + b_l +
  b_r)``. batchfold has one pair layer ``W_ap = [W_1 W_2]``, ``b``, and gives pair ``(i, j)``
  ``f(W_1 A_i + W_2 A_j + b) + f(W_1 A_j + W_2 A_i + b)``. With the edge from ``j`` to ``i``,
  ``W_r = W_1``, ``W_l = W_2``, ``b_r = b`` and ``b_l = 0`` the two terms are ``first`` and
  ``second``. ``b_l`` is held at zero (no gradient), so that the sum of the biases trains as
  batchfold's one bias does.
* The new pair state: dgllife concatenates the two A->P terms, ``f(W_e [first; second;
  P->P])`` with ``W_e`` of ``3 x pair`` inputs, where batchfold adds them, ``f(W_p [first +
  second; P->P])`` with ``2 x pair`` inputs. Loading ``W_e = [W_p1 W_p1 W_p2]`` gives the same
  value; to keep it so through training, ``update_edge.weight`` is a PyTorch parametrisation
  (``torch.nn.utils.parametrize``) of one ``[pair, 2 x pair]`` parameter that repeats its
  first block, so the shared block gets the sum of both gradients, as in batchfold. dgllife's
  own forward is unchanged: its ``update_edge`` matmul still has ``3 x pair`` inputs.
* dgllife's last module still holds pair-update layers; they are never used (the module runs
  with ``node_only=True``), get no gradient and are left at their own initialisation.

Timing
------

For each batch size and mode it prints one JSON line::

    {"system": "dgllife", "mode": "prebuilt", "batch_size": 64, "train_molecules_per_s": ...,
     "infer_molecules_per_s": ..., "median_s": ..., "repeats": 3, ...}

Modes: ``prebuilt`` (the batched graphs and targets are made before timing, as a data loader
would) and ``inloop`` (``dgl.batch`` of the per-molecule graphs, and the targets' stacking,
inside every timed step). The per-molecule graphs are made before timing in both.

A training step is forward, the summed squared error, backward and one plain SGD update
(``torch.optim.SGD``, ``--lr``); inference is the forward and the loss under
``torch.no_grad``. Batches are consecutive molecules of the file (full batches only). After
``--warmup`` untimed passes, each of ``--repeats`` timed passes runs every batch once;
``median_s`` is the median training pass and ``train_molecules_per_s`` = molecules per pass /
``median_s``; ``infer_median_s`` likewise. Every pass's time is in ``train_times_s`` and
``infer_times_s``, the peak memory of the run in ``peak_mb`` (``benchmarks/memory.py``).
PyTorch uses ``--threads`` threads (default 2).

With ``--loss-only`` it prints the summed loss of all the molecules of the file at the
weights read, and after one SGD step on all of them (``loss``, ``loss_after_step``).

Usage::

    python dgllife_weave.py MOLECULES.npz --weights W.npz [--batch-sizes 64,256]
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
os.environ.setdefault("DGLBACKEND", "pytorch")

from weave_io import (  # noqa: E402
    load_molecules,
    load_weights,
    parse_args,
    start_torch,
    time_modes,
)


def build_model(config, weights):
    """dgllife's Weave modules with batchfold's readout and head, holding ``weights``.

    ``weights`` are batchfold's tensors by ``state_dict`` name, loaded as the docstring says.
    Its ``predict(bg)`` gives the predictions ``[graphs, n_tasks]``; calling it on a batched
    graph and the targets gives the summed squared error.
    """
    import dgl
    import torch
    from dgllife.model.gnn.weave import WeaveGNN, WeaveLayer
    from torch import nn
    from torch.nn.utils import parametrize

    n_modules, atom_dim, pair_dim = config["n_modules"], config["atom_dim"], config["pair_dim"]

    class RepeatFirstBlock(nn.Module):
        """``[W_1 W_2]`` -> ``[W_1 W_1 W_2]``: one A->P block serving both of dgllife's."""

        def __init__(self, width):
            super().__init__()
            self.width = width

        def forward(self, weight):
            first = weight[:, : self.width]
            return torch.cat([first, weight], dim=1)

    def load_linear(layer, name, weight=None):
        """Copy batchfold's Linear ``name`` (or a given weight and its bias) into ``layer``."""
        with torch.no_grad():
            layer.weight.copy_(weights[f"{name}.weight"] if weight is None else weight)
            layer.bias.copy_(weights[f"{name}.bias"])

    def weave_layer(k):
        """dgllife's module ``k`` with batchfold's sizes and weights (see the docstring)."""
        atom_in = config["atom_features"] if k == 0 else atom_dim
        pair_in = config["pair_features"] if k == 0 else pair_dim
        layer = WeaveLayer(
            node_in_feats=atom_in,
            edge_in_feats=pair_in,
            node_node_hidden_feats=atom_dim,
            edge_node_hidden_feats=atom_dim,
            node_out_feats=atom_dim,
            node_edge_hidden_feats=pair_dim,
            edge_edge_hidden_feats=pair_dim,
            edge_out_feats=pair_dim,
        )
        name = f"weave.{k}"
        load_linear(layer.node_to_node, f"{name}.atom_to_atom_layer")
        load_linear(layer.edge_to_node, f"{name}.pair_to_atom_layer")
        load_linear(layer.update_node, f"{name}.atom_layer")
        if k == n_modules - 1:  # runs with node_only=True: its pair layers are never used
            return layer
        w_ap = weights[f"{name}.atom_to_pair_layer.weight"]  # [pair, 2 atom_in]: [W_1 W_2]
        load_linear(layer.right_node_to_edge, f"{name}.atom_to_pair_layer", w_ap[:, :atom_in])
        with torch.no_grad():
            layer.left_node_to_edge.weight.copy_(w_ap[:, atom_in:])
            layer.left_node_to_edge.bias.zero_()
        layer.left_node_to_edge.bias.requires_grad_(False)
        load_linear(layer.edge_to_edge, f"{name}.pair_to_pair_layer")
        update = layer.update_edge  # its weight: [W_p1 W_p2] with W_p1 repeated on use
        update.weight = nn.Parameter(weights[f"{name}.pair_layer.weight"].clone())
        with torch.no_grad():
            update.bias.copy_(weights[f"{name}.pair_layer.bias"])
        parametrize.register_parametrization(
            update, "weight", RepeatFirstBlock(pair_dim), unsafe=True
        )
        return layer

    class Weave(nn.Module):
        """dgllife's Weave modules, batchfold's readout and head; the loss of a batch."""

        def __init__(self):
            super().__init__()
            self.gnn = WeaveGNN(
                config["atom_features"], config["pair_features"], n_modules, atom_dim
            )
            self.gnn.gnn_layers = nn.ModuleList(weave_layer(k) for k in range(n_modules))
            self.atom_readout = nn.Linear(atom_dim, weights["atom_readout.weight"].shape[0])
            self.hidden_layer = nn.Linear(*weights["hidden_layer.weight"].shape[::-1])
            self.output = nn.Linear(*weights["output.weight"].shape[::-1])
            for name in ("atom_readout", "hidden_layer", "output"):
                load_linear(getattr(self, name), name)
            self.gaussian = config["gather"] == "gaussian"
            self.register_buffer(
                "mean", torch.tensor([m for m, _ in config["gaussian_memberships"]])
            )
            self.register_buffer(
                "std", torch.tensor([s for _, s in config["gaussian_memberships"]])
            )

        def predict(self, bg):
            """The predictions of a batched graph's molecules, ``[graphs, n_tasks]``."""
            atoms = self.gnn(bg, bg.ndata["x"], bg.edata["e"], node_only=True)
            r = torch.tanh(self.atom_readout(atoms))
            if self.gaussian:
                w = torch.exp(-0.5 * ((r.unsqueeze(-1) - self.mean) / self.std) ** 2)
                r = (w / w.sum(dim=-1, keepdim=True)).flatten(-2)
            with bg.local_scope():
                bg.ndata["r"] = r
                molecule = dgl.readout_nodes(bg, "r", op="sum")
            return self.output(torch.relu(self.hidden_layer(molecule)))

        def forward(self, bg, target):
            return (self.predict(bg) - target).pow(2).sum()

    return Weave()


def molecule_graph(atoms, pairs, index):
    """One molecule's graph: an edge per ordered pair (i, j), from j to i."""
    import dgl
    import torch

    index = torch.from_numpy(index.copy())
    g = dgl.graph((index[:, 1], index[:, 0]), num_nodes=len(atoms))
    g.ndata["x"] = torch.from_numpy(atoms.copy())
    g.edata["e"] = torch.from_numpy(pairs.copy())
    return g


def import_dgllife():
    """``(dgl, versions)``, or None after saying how to install DGL-LifeSci."""
    try:
        import dgl
        import dgllife
        import torch
        from dgllife.model.gnn.weave import WeaveGNN, WeaveLayer  # noqa: F401
    except ImportError as error:
        print(
            f"dgllife is not installed ({error}); run bash benchmarks/setup_peers.sh",
            file=sys.stderr,
        )
        return None
    return dgl, f"dgllife {dgllife.__version__}, dgl {dgl.__version__}, torch {torch.__version__}"


def main(argv=None) -> int:
    """Load, check the options, then print the loss or the timings (see the docstring)."""
    args = parse_args(__doc__, argv)
    torch = start_torch(args.threads)
    found = import_dgllife()
    if found is None:
        return 1
    dgl, version = found

    config, arrays = load_weights(args.weights)
    weights = {k: torch.from_numpy(v) for k, v in arrays.items()}

    molecules = load_molecules(args.molecules)
    graphs = [molecule_graph(a, p, i) for a, p, i, _ in molecules]
    targets = [torch.from_numpy(t.copy()) for *_, t in molecules]
    model = build_model(config, weights)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=args.lr)

    def train_step(bg, target):
        opt.zero_grad(set_to_none=True)
        loss = model(bg, target)
        loss.backward()
        opt.step()
        return loss.item()

    def infer_step(bg, target):
        with torch.no_grad():
            return model(bg, target).item()

    if args.loss_only:
        every = (dgl.batch(graphs), torch.stack(targets))
        before = infer_step(*every)
        train_step(*every)
        after = infer_step(*every)
        line = {"system": "dgllife", "loss": before, "loss_after_step": after, "lr": args.lr}
        print(json.dumps({**line, "version": version}), flush=True)
        return 0

    def batches(mode, spans):
        if mode == "prebuilt":
            items = [
                (dgl.batch([graphs[i] for i in s]), torch.stack([targets[i] for i in s]))
                for s in spans
            ]
            return items, lambda item: item
        items = [([graphs[i] for i in s], [targets[i] for i in s]) for s in spans]
        return items, lambda item: (dgl.batch(item[0]), torch.stack(item[1]))

    time_modes(
        args,
        "dgllife",
        version,
        len(graphs),
        batches,
        lambda item: train_step(*item),
        lambda item: infer_step(*item),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
