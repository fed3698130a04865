"""Train a Tree-LSTM on the Stanford Sentiment Treebank for a few minutes, batched by batchfold.

Run with ``make demo`` (or ``python examples/demo.py [extra batchfold train options]``). It
runs ``batchfold train sst`` for 2 epochs over the 8,544 training trees on 2 threads, in
batches of 100 trees (Fold's size; the command's default, 25, takes longer per epoch), with
a hidden size of 150 and a constant learning rate (the command's defaults, 300 and a cosine
decay over 30 epochs, suit a full run), printing dev accuracy after each epoch, then trees/s
and the speedup of batching over running the same model one tree at a time on the same
weights. Results go to
``runs/demo``. Without SST data it says where to get it and exits with status 1.

The full run (30 epochs) is ``batchfold train sst``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from batchfold import cli

OUT = Path("runs/demo")
OPTIONS = [
    *("--epochs", "2", "--threads", "2", "--batch-size", "100"),
    *("--hidden", "150", "--lr-schedule", "constant"),
    *("--compare-batches", "2", "--out", str(OUT)),
]


def main(extra: list[str]) -> int:
    """Run the short training and print its summary; returns the exit status."""
    status = cli.main(["train", "sst", *OPTIONS, *extra])
    if status != 0:
        return status
    summary = json.loads((OUT / "test.json").read_text())
    speed = summary["throughput"]
    print(
        f"\ndemo: dev root accuracy {summary['dev']['root_fine']:.1f}% (fine-grained), "
        f"{summary['dev']['root_binary']:.1f}% (binary) at epoch {summary['best_epoch']}; "
        f"training {summary['train_items_per_s']:.0f} trees/s"
    )
    if speed is not None:
        print(
            f"demo: batched {speed['batched_per_s']:.0f} trees/s vs one tree at a time "
            f"{speed['one_at_a_time_per_s']:.0f} trees/s: {speed['speedup']:.1f}x faster"
        )
    print(f"demo: curves, checkpoints and test metrics are in {OUT}/")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
