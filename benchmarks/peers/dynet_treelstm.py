"""Binary Tree-LSTM on DyNet, timed with each of DyNet's automatic batching modes.

Runs inside DyNet's virtual environment (``benchmarks/.peers/dynet``, made by
``benchmarks/setup_peers.sh``); it needs ``dynet`` (PyPI ``dynet38``) and NumPy only.
The model, the tree file format and the weights layout are described in ``treeio.py``
beside this script (embedding 300, hidden 150, 5 classes, loss summed over every node).

For each autobatch mode and batch size it prints one JSON line::

    {"system": "dynet", "mode": "agenda", "autobatch": 1, "batch_size": 32,
     "train_trees_per_s": ..., "infer_trees_per_s": ..., "median_s": ..., "repeats": 5, ...}

* A training step is: build the graph of every tree of the batch, sum all node losses,
  forward, backward, one plain SGD update (no gradient clipping).
* Inference is the same forward (loss value) without backward or update.
* One timed repeat is a pass over all full batches of the file (fewer trees than one batch:
  the trees are cycled to fill it); ``median_s`` is the median training pass and
  ``train_trees_per_s`` = trees per pass / ``median_s``; ``infer_median_s`` likewise.
* Modes: 0 = ``none`` (no autobatching), 1 = ``agenda``, 2 = ``depth``. DyNet fixes the mode
  when it is imported, so with several modes each one runs in a child process.
* Each line also has the time of every timed pass (``train_times_s``, ``infer_times_s``) and
  the peak memory of the warm-up and timed passes (``peak_mb``: the rise of resident memory,
  see ``benchmarks/memory.py``; ``resident_peak_mb``: the whole process). Time training and
  inference in separate runs (``--no-infer``, ``--no-train``) for a peak of each.
* DyNet's CPU build here runs single-threaded (no OpenMP or MKL in the wheel); ``threads``
  in the output is therefore 1.

Usage::

    python dynet_treelstm.py TREES.json [--batch-sizes 1,32,256] [--repeats 5]
        [--autobatch 0,1,2] [--mem 4096] [--weights W.npz] [--lr 0.05] [--loss-only]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import treeio  # noqa: E402
from dynet_modes import MODE_NAMES, run_each_mode, start_dynet  # noqa: E402

import memory  # noqa: E402  (benchmarks/memory.py: peak resident memory, standard library only)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("trees", help="tree file (JSON, see treeio.py)")
    p.add_argument("--batch-sizes", default="1,32,256")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1, help="untimed batches before timing")
    p.add_argument("--autobatch", default="0,1,2", help="modes: 0 none, 1 agenda, 2 depth")
    p.add_argument("--mem", default="4096", help="DyNet memory pool in MB (--dynet-mem)")
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


class Model:
    def __init__(self, dy, weights, lr):
        self.dy = dy
        self.pc = dy.ParameterCollection()
        self.E = self.pc.lookup_parameters_from_numpy(weights["embedding"])
        self.LW = self.pc.parameters_from_numpy(weights["leaf_W"])
        self.Lb = self.pc.parameters_from_numpy(weights["leaf_b"])
        self.IU = self.pc.parameters_from_numpy(weights["internal_U"])
        self.Ib = self.pc.parameters_from_numpy(weights["internal_b"])
        self.OW = self.pc.parameters_from_numpy(weights["out_W"])
        self.Ob = self.pc.parameters_from_numpy(weights["out_b"])
        self.trainer = dy.SimpleSGDTrainer(self.pc, learning_rate=lr)
        self.trainer.set_clip_threshold(0.0)  # plain SGD, as in the other systems

    def tree_losses(self, t, out):
        """Append the loss expression of every node of tree ``t`` to ``out``."""
        dy = self.dy
        H = treeio.HIDDEN
        hs = [None] * t.size
        cs = [None] * t.size
        for k in range(t.size):
            if t.left[k] < 0:
                g = dy.affine_transform([self.Lb, self.LW, dy.lookup(self.E, t.word[k])])
                io = dy.logistic(dy.pick_range(g, 0, 2 * H))
                u = dy.tanh(dy.pick_range(g, 2 * H, 3 * H))
                c = dy.cmult(dy.pick_range(io, 0, H), u)
                o = dy.pick_range(io, H, 2 * H)
            else:
                lk, rk = t.left[k], t.right[k]
                x = dy.concatenate([hs[lk], hs[rk]])
                g = dy.affine_transform([self.Ib, self.IU, x])
                s = dy.logistic(dy.pick_range(g, 0, 4 * H))
                u = dy.tanh(dy.pick_range(g, 4 * H, 5 * H))
                c = (
                    dy.cmult(dy.pick_range(s, 0, H), u)
                    + dy.cmult(dy.pick_range(s, H, 2 * H), cs[lk])
                    + dy.cmult(dy.pick_range(s, 2 * H, 3 * H), cs[rk])
                )
                o = dy.pick_range(s, 3 * H, 4 * H)
            h = dy.cmult(o, dy.tanh(c))
            hs[k], cs[k] = h, c
            logits = dy.affine_transform([self.Ob, self.OW, h])
            out.append(dy.pickneglogsoftmax(logits, t.label[k]))

    def batch_loss(self, batch):
        self.dy.renew_cg()
        losses = []
        for t in batch:
            self.tree_losses(t, losses)
        return self.dy.esum(losses)

    def train_step(self, batch) -> float:
        loss = self.batch_loss(batch)
        v = loss.value()
        loss.backward()
        self.trainer.update()
        return v

    def infer_step(self, batch) -> float:
        return self.batch_loss(batch).value()


def run_mode(args, mode: int) -> None:
    dy, dy_version = start_dynet(args.mem, mode)

    trees = treeio.load_trees(args.trees)
    vocab = max(args.vocab, treeio.max_word(trees) + 1)
    weights = treeio.load_weights(args.weights, vocab, args.seed)
    model = Model(dy, weights, args.lr)

    if args.loss_only:
        chunks = [trees[i : i + 64] for i in range(0, len(trees), 64)]
        before = sum(model.infer_step(c) for c in chunks)
        model.train_step(trees)
        after = sum(model.infer_step(c) for c in chunks)
        out = {
            "system": "dynet",
            "mode": MODE_NAMES[mode],
            "loss": before,
            "loss_after_step": after,
        }
        print(json.dumps(out), flush=True)
        return

    for bs in treeio.parse_int_list(args.batch_sizes):
        batches = treeio.make_batches(trees, bs)
        n_trees = sum(len(b) for b in batches)
        train_times, infer_times = [], []
        with memory.PeakMemory() as peak:  # warm-up and timed passes
            for i in range(args.warmup):
                b = batches[i % len(batches)]
                if not args.no_train:
                    model.train_step(b)
                if not args.no_infer:
                    model.infer_step(b)
            for _ in range(args.repeats):
                if not args.no_train:
                    t0 = time.perf_counter()
                    for b in batches:
                        model.train_step(b)
                    train_times.append(time.perf_counter() - t0)
                if not args.no_infer:
                    t0 = time.perf_counter()
                    for b in batches:
                        model.infer_step(b)
                    infer_times.append(time.perf_counter() - t0)
        tr = treeio.median(train_times) if train_times else None
        inf = treeio.median(infer_times) if infer_times else None
        print(
            json.dumps(
                {
                    "system": "dynet",
                    "mode": MODE_NAMES[mode],
                    "autobatch": mode,
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
                    "threads": 1,
                    "version": dy_version,
                }
            ),
            flush=True,
        )


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    return run_each_mode(__file__, argv, args.autobatch, lambda mode: run_mode(args, mode))


if __name__ == "__main__":
    sys.exit(main())
