"""The DGL-LifeSci Weave peer (``dgllife_weave.py``) trained to accuracy as batchfold trains ESOL.

Runs inside DGL's virtual environment (``benchmarks/.peers/dgl``); ``benchmarks/
weave_accuracy.py`` writes its input files and runs it. The same as ``pyg_weave_train.py``
(its docstring has the inputs, the loop and the output lines) with the model of
``dgllife_weave.py`` (``build_model``: dgllife's ``WeaveLayer``s holding batchfold's weights,
the repeated A->P block tied, one DGL graph per molecule from ``molecule_graph``). Each
training batch is ``dgl.batch`` of its molecules' graphs, inside the step. Parameters that
get no gradient (dgllife's held-at-zero A->P bias, its last module's unused pair layers) are
left out of Adam or skipped by it, so the parameters that train are batchfold's.

Usage::

    python dgllife_weave_train.py TRAIN.npz DEV.npz TEST.npz --weights W.npz [--epochs 100]
        [--lr 1e-3] [--batch-size 32] [--eval-batch-size 256] [--seed 0] [--threads 1]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # weave_io beside this file
os.environ.setdefault("DGLBACKEND", "pytorch")

from dgllife_weave import build_model, import_dgllife, molecule_graph  # noqa: E402
from weave_io import parse_train_args, start_torch, train_peer  # noqa: E402


def main(argv=None) -> int:
    """Load the three splits and the weights, then train and print (see the docstring)."""
    args = parse_train_args(__doc__, argv)
    start_torch(args.threads)
    found = import_dgllife()
    if found is None:
        return 1
    dgl, version = found
    graph = lambda a, p, i, _: molecule_graph(a, p, i)  # noqa: E731  (the target is not in it)
    train_peer(args, "dgllife", version, build_model, graph, dgl.batch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
