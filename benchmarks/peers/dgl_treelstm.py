"""Binary Tree-LSTM on DGL (``dgl.prop_nodes_topo``) with PyTorch on the CPU, timed.

Runs inside DGL's virtual environment (``benchmarks/.peers/dgl``, made by
``benchmarks/setup_peers.sh``: DGL 1.1.3, torch 2.13 CPU); it needs ``dgl``, ``torch`` and
NumPy. The model, the tree file format and the weights layout are described in ``treeio.py``
beside this script (embedding 300, hidden 150, 5 classes, loss summed over every node).

Each tree is a DGL graph with an edge from each child to its parent (the left child's edge
first, so that a node's mailbox holds ``[left, right]``). A batch is ``dgl.batch`` of the
trees' graphs. Leaves are computed in one batched call; then ``dgl.prop_nodes_topo`` visits
the internal nodes frontier by frontier (a node is ready once its children are), with
messages carrying the children's ``h`` and ``c`` and a reduce function that applies the cell to all
nodes of a frontier at once. The output layer and the loss run on all nodes at once.

For each mode and batch size it prints one JSON line::

    {"system": "dgl", "mode": "prebuilt", "batch_size": 32, "train_trees_per_s": ...,
     "infer_trees_per_s": ..., "median_s": ..., "repeats": 5, ...}

Modes:

* ``prebuilt``: the batched graphs are made before timing (as a data loader would).
* ``inloop``: ``dgl.batch`` of the per-tree graphs is inside every timed step.

Each line also has the time of every timed pass (``train_times_s``, ``infer_times_s``) and the
peak memory of the warm-up and timed passes (``peak_mb``: the rise of resident memory, see
``benchmarks/memory.py``); time training and inference in separate runs (``--no-infer``,
``--no-train``) for a peak of each.

A training step is forward, backward and one plain SGD update (``torch.optim.SGD``);
inference is the forward (loss value) under ``torch.no_grad``. One timed repeat is a pass
over all full batches of the file (fewer trees than one batch: the trees are cycled to fill
it); ``median_s`` is the median training pass and ``train_trees_per_s`` = trees per pass /
``median_s``; ``infer_median_s`` likewise. PyTorch uses ``--threads`` threads (default 2).

Usage::

    python dgl_treelstm.py TREES.json [--batch-sizes 1,32,256] [--repeats 5]
        [--modes prebuilt,inloop] [--threads 2] [--weights W.npz] [--lr 0.05] [--loss-only]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("DGLBACKEND", "pytorch")

import treeio  # noqa: E402
from passes import timed_passes  # noqa: E402  (beside this file; it reads benchmarks/memory.py)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("trees", help="tree file (JSON, see treeio.py)")
    p.add_argument("--batch-sizes", default="1,32,256")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1, help="untimed batches before timing")
    p.add_argument("--modes", default="prebuilt,inloop")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--weights", help=".npz initial weights (see treeio.py)")
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0, help="seed of the weights made without --weights")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument(
        "--loss-only",
        action="store_true",
        help="print the initial summed loss, and the loss after one SGD step on all trees",
    )
    p.add_argument("--no-train", action="store_true", help="time inference only")
    p.add_argument("--no-infer", action="store_true", help="time training only")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    with contextlib.suppress(RuntimeError):  # already set in this process
        torch.set_num_interop_threads(args.threads)
    import dgl
    import torch.nn.functional as F
    from torch import nn

    # DGL warns once per frontier of leaves (no incoming edges); that is expected here.
    warnings.filterwarnings("ignore", message=".*does not contain valid edges.*")

    H = treeio.HIDDEN
    trees = treeio.load_trees(args.trees)
    vocab = max(args.vocab, treeio.max_word(trees) + 1)
    weights = treeio.load_weights(args.weights, vocab, args.seed)

    def message(edges):
        return {"h": edges.src["h"], "c": edges.src["c"]}

    class TreeLSTM(nn.Module):
        def __init__(self, w):
            super().__init__()
            for k, v in w.items():
                setattr(self, k, nn.Parameter(torch.from_numpy(v.copy())))

        def reduce(self, nodes):
            hm = nodes.mailbox["h"]  # [n, 2, H]: left, right
            cm = nodes.mailbox["c"]
            g = torch.addmm(self.internal_b, hm.reshape(hm.shape[0], 2 * H), self.internal_U.t())
            s = torch.sigmoid(g[:, : 4 * H])
            u = torch.tanh(g[:, 4 * H :])
            c = s[:, :H] * u + s[:, H : 2 * H] * cm[:, 0] + s[:, 2 * H : 3 * H] * cm[:, 1]
            h = s[:, 3 * H : 4 * H] * torch.tanh(c)
            return {"h": h, "c": c}

        def forward(self, bg):
            n = bg.num_nodes()
            leaf_ids = torch.nonzero(bg.ndata["is_leaf"], as_tuple=True)[0]
            x = self.embedding[bg.ndata["word"][leaf_ids]]
            g = torch.addmm(self.leaf_b, x, self.leaf_W.t())
            io = torch.sigmoid(g[:, : 2 * H])
            c_leaf = io[:, :H] * torch.tanh(g[:, 2 * H :])
            h_leaf = io[:, H:] * torch.tanh(c_leaf)
            zeros = x.new_zeros(n, H)
            bg.ndata["h"] = zeros.index_copy(0, leaf_ids, h_leaf)
            bg.ndata["c"] = zeros.index_copy(0, leaf_ids, c_leaf)
            dgl.prop_nodes_topo(bg, message, self.reduce)
            h = bg.ndata.pop("h")
            bg.ndata.pop("c")
            logits = torch.addmm(self.out_b, h, self.out_W.t())
            return F.cross_entropy(logits, bg.ndata["y"], reduction="sum")

    def tree_graph(t):
        src, dst = [], []
        for k in range(t.size):
            if t.left[k] >= 0:
                src += [t.left[k], t.right[k]]
                dst += [k, k]
        g = dgl.graph(
            (torch.tensor(src, dtype=torch.int64), torch.tensor(dst, dtype=torch.int64)),
            num_nodes=t.size,
        )
        g.ndata["word"] = torch.tensor([max(w, 0) for w in t.word], dtype=torch.int64)
        g.ndata["is_leaf"] = torch.tensor([w >= 0 for w in t.word], dtype=torch.bool)
        g.ndata["y"] = torch.tensor(t.label, dtype=torch.int64)
        return g

    graphs = [tree_graph(t) for t in trees]
    model = TreeLSTM(weights)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)

    def train_step(bg):
        opt.zero_grad(set_to_none=True)
        loss = model(bg)
        loss.backward()
        opt.step()
        return loss.item()

    def infer_step(bg):
        with torch.no_grad():
            return model(bg).item()

    if args.loss_only:
        chunks = [graphs[i : i + 64] for i in range(0, len(graphs), 64)]
        before = sum(infer_step(dgl.batch(c)) for c in chunks)
        train_step(dgl.batch(graphs))
        after = sum(infer_step(dgl.batch(c)) for c in chunks)
        print(json.dumps({"system": "dgl", "loss": before, "loss_after_step": after}), flush=True)
        return 0

    for mode in [m for m in args.modes.replace(",", " ").split()]:
        if mode not in ("prebuilt", "inloop"):
            raise SystemExit(f"unknown mode {mode!r} (prebuilt, inloop)")
        for bs in treeio.parse_int_list(args.batch_sizes):
            batches = treeio.make_batches(graphs, bs)
            n_trees = sum(len(b) for b in batches)
            if mode == "prebuilt":
                items = [dgl.batch(b) for b in batches]

                def get(item):
                    return item
            else:
                items = batches
                get = dgl.batch
            train_times, infer_times, peak = timed_passes(
                items,
                get,
                None if args.no_train else train_step,
                None if args.no_infer else infer_step,
                [items[i % len(items)] for i in range(args.warmup)],
                args.repeats,
            )
            tr = treeio.median(train_times) if train_times else None
            inf = treeio.median(infer_times) if infer_times else None
            print(
                json.dumps(
                    {
                        "system": "dgl",
                        "mode": mode,
                        "batch_size": bs,
                        "train_trees_per_s": n_trees / tr if tr else None,
                        "infer_trees_per_s": n_trees / inf if inf else None,
                        "median_s": tr,
                        "infer_median_s": inf,
                        "repeats": args.repeats,
                        "trees_per_pass": n_trees,
                        "train_times_s": train_times,
                        "infer_times_s": infer_times,
                        **peak.as_dict(),
                        "threads": args.threads,
                        "version": f"dgl {dgl.__version__}, torch {torch.__version__}",
                    }
                ),
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
