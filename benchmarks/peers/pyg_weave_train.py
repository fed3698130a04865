"""The PyTorch Geometric Weave peer (``pyg_weave.py``) trained to accuracy as batchfold trains ESOL.

Runs inside PyG's virtual environment (``benchmarks/.peers/pyg``); ``benchmarks/
weave_accuracy.py`` writes its input files and runs it. It reads three molecule files (the
train, dev and test molecules of batchfold's split, in batchfold's order) and batchfold's
initial weights, in ``dgllife_weave.py``'s formats, builds the model of ``pyg_weave.py``
(``build_model``, one ``Data`` per molecule from ``molecule_data``) and trains it with the
loop of ``weave_io.train_to_accuracy``: standardised targets, the summed squared error, Adam
with a cosine rate, batchfold's per-epoch shuffles, the best dev RMSE's epoch tested. Each
training batch is ``Batch.from_data_list`` of its molecules' ``Data``, inside the step, as a
shuffling data loader makes it.

It prints one JSON line per epoch (``epoch``, ``lr_scale``, ``train_loss``, ``seconds``,
``dev``), then a summary line (``best_epoch``, ``dev``, ``test``, ``dev_at_start``,
``train_seconds``, ``run_seconds``, ``version``, ...).

Usage::

    python pyg_weave_train.py TRAIN.npz DEV.npz TEST.npz --weights W.npz [--epochs 100]
        [--lr 1e-3] [--batch-size 32] [--eval-batch-size 256] [--seed 0] [--threads 1]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # weave_io beside this file

from pyg_weave import build_model, import_pyg, molecule_data  # noqa: E402
from weave_io import parse_train_args, start_torch, train_peer  # noqa: E402


def main(argv=None) -> int:
    """Load the three splits and the weights, then train and print (see the docstring)."""
    args = parse_train_args(__doc__, argv)
    start_torch(args.threads)
    found = import_pyg()
    if found is None:
        return 1
    batch, version = found
    train_peer(args, "pyg", version, build_model, molecule_data, batch.from_data_list)
    return 0


if __name__ == "__main__":
    sys.exit(main())
