"""TensorFlow Fold's ICLR 2017 benchmark model on DyNet, timed with each autobatch mode.

Runs inside DyNet's virtual environment (``benchmarks/.peers/dynet``, made by
``benchmarks/setup_peers.sh``); it needs ``dynet`` (PyPI ``dynet38``) and NumPy only. It is
the DyNet side of ``benchmarks/bench_fold.py`` and follows the process protocol of
``dynet_treelstm.py``: one JSON line per configuration, one child process per autobatch mode.

Model (state size ``d``, read from the weights): a leaf's state is its row of ``embedding``;
an internal node with children states ``l`` and ``r`` computes
``z = relu(hidden_W [l; r] + hidden_b)``, splits ``gate_W z + gate_b`` into ``f_l, f_r, i, g``
and returns ``sigmoid(f_l) * l + sigmoid(f_r) * r + sigmoid(i) * tanh(g)``. The loss of a
batch is Fold's L2 loss, half the summed squares of the roots' states; a training step is the
forward, the backward and one plain SGD update (no clipping).

Weights file (.npz), rows are outputs: ``embedding [V, d]``, ``hidden_W [d, 2d]``,
``hidden_b [d]``, ``gate_W [4d, d]``, ``gate_b [4d]`` (rows of ``gate_W`` in order f_l, f_r,
i, g). Trees: ``treeio.py``'s format (a leaf is its embedding row; labels are ignored).

Timing: the file's trees are cut into consecutive batches of each batch size; ``--warmup``
batches run untimed, then ``--repeats`` batches are timed one step each (batches are used in
turn, so a file of ``(warmup + repeats) * batch`` trees gives every step fresh trees). Each
line has ``median_s`` (per step), ``times_s``, ``ms_per_tree`` and the peak memory of the
warm-up and timed steps (see ``benchmarks/memory.py``).

Usage::

    python dynet_fold.py TREES.json --weights W.npz [--batch-sizes 1,32] [--repeats 2]
        [--warmup 1] [--autobatch 0,1,2] [--mem 4096] [--lr 1e-5] [--loss-only]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import treeio  # noqa: E402
from dynet_modes import MODE_NAMES, run_each_mode, start_dynet  # noqa: E402

import memory  # noqa: E402  (benchmarks/memory.py, standard library only)

WEIGHTS = ("embedding", "hidden_W", "hidden_b", "gate_W", "gate_b")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("trees", help="tree file (JSON, see treeio.py)")
    p.add_argument("--weights", required=True, help=".npz weights (see above)")
    p.add_argument("--batch-sizes", default="1,32")
    p.add_argument("--repeats", type=int, default=2, help="timed steps per batch size")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    p.add_argument("--autobatch", default="0,1,2", help="modes: 0 none, 1 agenda, 2 depth")
    p.add_argument("--mem", default="4096", help="DyNet memory in MB (--dynet-mem)")
    p.add_argument("--lr", type=float, default=1e-5, help="SGD rate (Fold's benchmark: 1e-5)")
    p.add_argument(
        "--loss-only",
        action="store_true",
        help="print the loss of all trees at the initial weights and after one SGD step on them",
    )
    return p.parse_args(argv)


class FoldModel:
    """The benchmark cell and its SGD trainer, on DyNet."""

    def __init__(self, dy, weights, lr):
        self.dy = dy
        self.d = weights["hidden_b"].shape[0]
        self.pc = dy.ParameterCollection()
        self.E = self.pc.lookup_parameters_from_numpy(weights["embedding"])
        self.HW = self.pc.parameters_from_numpy(weights["hidden_W"])
        self.Hb = self.pc.parameters_from_numpy(weights["hidden_b"])
        self.GW = self.pc.parameters_from_numpy(weights["gate_W"])
        self.Gb = self.pc.parameters_from_numpy(weights["gate_b"])
        self.trainer = dy.SimpleSGDTrainer(self.pc, learning_rate=lr)
        self.trainer.set_clip_threshold(0.0)  # plain SGD, as in the other systems

    def root(self, t):
        """The root state of tree ``t`` (post-order, so children come before parents)."""
        dy, d = self.dy, self.d
        states = [None] * t.size
        for k in range(t.size):
            if t.left[k] < 0:
                states[k] = dy.lookup(self.E, t.word[k])
                continue
            left, right = states[t.left[k]], states[t.right[k]]
            z = dy.rectify(dy.affine_transform([self.Hb, self.HW, dy.concatenate([left, right])]))
            g = dy.affine_transform([self.Gb, self.GW, z])
            s = dy.logistic(dy.pick_range(g, 0, 3 * d))
            states[k] = (
                dy.cmult(dy.pick_range(s, 0, d), left)
                + dy.cmult(dy.pick_range(s, d, 2 * d), right)
                + dy.cmult(dy.pick_range(s, 2 * d, 3 * d), dy.tanh(dy.pick_range(g, 3 * d, 4 * d)))
            )
        return states[-1]

    def batch_loss(self, batch):
        self.dy.renew_cg()
        return self.dy.esum([self.dy.squared_norm(self.root(t)) for t in batch]) * 0.5

    def train_step(self, batch) -> float:
        loss = self.batch_loss(batch)
        value = loss.value()
        loss.backward()
        self.trainer.update()
        return value


def load_fold_weights(path):
    with np.load(path) as z:
        w = {k: np.ascontiguousarray(z[k], dtype=np.float32) for k in WEIGHTS}
    d = w["hidden_b"].shape[0]
    expected = {
        "hidden_W": (d, 2 * d),
        "gate_W": (4 * d, d),
        "gate_b": (4 * d,),
    }
    for name, shape in expected.items():
        if w[name].shape != shape:
            raise ValueError(f"weight {name!r} has shape {w[name].shape}, expected {shape}")
    if w["embedding"].ndim != 2 or w["embedding"].shape[1] != d:
        raise ValueError(f"embedding has shape {w['embedding'].shape}, expected [V, {d}]")
    return w


def run_mode(args, mode: int) -> None:
    dy, dy_version = start_dynet(args.mem, mode)

    trees = treeio.load_trees(args.trees)
    weights = load_fold_weights(args.weights)
    if treeio.max_word(trees) >= weights["embedding"].shape[0]:
        raise SystemExit("a leaf's word id is past the embedding table")
    model = FoldModel(dy, weights, args.lr)

    if args.loss_only:
        before = model.batch_loss(trees).value()
        model.train_step(trees)
        after = model.batch_loss(trees).value()
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
        times = []
        with memory.PeakMemory() as peak:  # warm-up and timed steps
            for i in range(args.warmup):
                model.train_step(batches[i % len(batches)])
            for i in range(args.warmup, args.warmup + args.repeats):
                start = time.perf_counter()
                model.train_step(batches[i % len(batches)])
                times.append(time.perf_counter() - start)
        median = treeio.median(times)
        line = {
            "system": "dynet",
            "mode": MODE_NAMES[mode],
            "autobatch": mode,
            "batch_size": bs,
            "median_s": median,
            "times_s": times,
            "ms_per_tree": 1e3 * median / bs,
            **peak.as_dict(),
            "dynet_mem_mb": args.mem,
            "threads": 1,
            "version": dy_version,
        }
        print(json.dumps(line), flush=True)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    return run_each_mode(__file__, argv, args.autobatch, lambda mode: run_mode(args, mode))


if __name__ == "__main__":
    sys.exit(main())
