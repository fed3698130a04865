"""Training throughput with 1 and 2 processes under torchrun, and the scaling efficiency.

Runs ``batchfold train sst`` (the Tree-LSTM on SST's training trees, GloVe 50d) for one
epoch on the first ``--trees`` training trees, each process with one thread, with 1 and
then 2 processes (gloo on CPU), for both front ends, and reads the training throughput
from ``metrics.jsonl``. Scaling efficiency is ``rate(2) / (2 * rate(1))``.

    python benchmarks/bench_distributed.py             # needs ../shared/data/sst

Writes ``benchmarks/results/distributed.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from machine import describe_machine, markdown_table

RESULTS = Path(__file__).resolve().parent / "results"
SRC = Path(__file__).resolve().parents[1] / "src"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_rate(front_end: str, processes: int, trees: int, batch: int) -> dict[str, Any]:
    """One epoch of SST training with ``processes`` ranks; its trees/s and seconds."""
    with tempfile.TemporaryDirectory() as out:
        argv = [
            *("train", "sst", "--front-end", front_end, "--epochs", "1", "--threads", "1"),
            *("--max-train", str(trees), "--max-eval", "50", "--compare-batches", "0"),
            *("--batch-size", str(batch), "--out", out, "--no-progress"),
        ]
        launcher = [
            *("-m", "torch.distributed.run", f"--nproc_per_node={processes}"),
            *("--master_addr=127.0.0.1", f"--master_port={_free_port()}"),
        ]
        command = [sys.executable, *launcher, "-m", "batchfold.cli", *argv]
        env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
        if done.returncode:
            raise RuntimeError(f"{processes} process(es), {front_end}: {done.stderr[-2000:]}")
        record = json.loads((Path(out) / "metrics.jsonl").read_text().splitlines()[0])
    return {"trees_per_s": record["items_per_s"], "seconds": record["seconds"]}


def run(trees: int, batch: int) -> dict[str, Any]:
    """Every front end with 1 and 2 processes; returns the JSON-ready results."""
    rows = []
    for front_end in ("blocks", "lazy"):
        one = train_rate(front_end, 1, trees, batch)
        two = train_rate(front_end, 2, trees, batch)
        efficiency = two["trees_per_s"] / (2 * one["trees_per_s"])
        rows.append(
            {"front_end": front_end, "one": one, "two": two, "scaling_efficiency": efficiency}
        )
        print(
            f"{front_end}: 1 process {one['trees_per_s']:.1f}, 2 processes "
            f"{two['trees_per_s']:.1f} trees/s, efficiency {efficiency:.2f}"
        )
    return {"machine": describe_machine(1), "trees": trees, "batch": batch, "rows": rows}


def summary(results: dict[str, Any]) -> str:
    """The results as markdown."""
    m = results["machine"]
    table = [
        [
            r["front_end"],
            f"{r['one']['trees_per_s']:.1f}",
            f"{r['two']['trees_per_s']:.1f}",
            f"{r['scaling_efficiency']:.2f}",
        ]
        for r in results["rows"]
    ]
    head = ["front end", "1 process, trees/s", "2 processes, trees/s", "scaling efficiency"]
    return (
        f"# SST Tree-LSTM training with 1 and 2 processes (torchrun, gloo)\n\n"
        f"{m['cpu']}, {m['cpus']} CPUs, 1 thread per process, torch {m['torch']}, commit "
        f"{m['commit']}, {m['date']}; one epoch on {results['trees']} training trees, batch "
        f"{results['batch']}.\n\n" + markdown_table(head, table) + "\n"
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: ``--trees``, ``--batch-size``, ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trees", type=int, default=2000, help="training trees per epoch")
    parser.add_argument("--batch-size", type=int, default=64, help="trees per batch (all ranks)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for JSON and markdown")
    args = parser.parse_args(argv)
    results = run(args.trees, args.batch_size)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "distributed.json").write_text(json.dumps(results, indent=1))
    (args.out / "distributed.md").write_text(summary(results))
    print(summary(results))


if __name__ == "__main__":
    main()
