"""batch_map's recording with its graph kept between calls (the default) and made anew each call.

One process, the two settings alternating call by call (the kept graph is dropped with
``batchfold.lazy.graphs.forget()`` before each "new graph" call), so that both see the same
machine: on the 2-vCPU VM, timings of separate processes moved by up to 2x. Workloads, each
in batches of per-instance code written plainly:

- **message passing (ESOL)** and **feed-forward attention**: ``bench_ragged.py``'s, batch 64;
- **Weave**: ``weave_predict`` on ESOL molecules (random graphs of their sizes without rdkit or
  the data), batch 64;
- **binary Tree-LSTM**: ``tree_node_losses`` on random 2-60-leaf trees, batch 256.

    python benchmarks/bench_graph_reuse.py [--rounds 6] [--threads 1]

Writes ``benchmarks/results/graph-reuse.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch

import batchfold as bf
from batchfold.data.trees import random_tree
from batchfold.lazy import graphs
from batchfold.models.tree_lstm import TreeLSTMClassifier, tree_node_losses
from batchfold.models.weave import WeaveModel, weave_predict
from bench_ragged import workloads
from machine import describe_machine, markdown_table, write_results

RESULTS = Path(__file__).resolve().parent / "results"


def cases(rng: random.Random) -> dict[str, tuple[Any, list[list[Any]]]]:
    """name -> (per-instance function, batches)."""
    found = {}
    for name in ("message passing (ESOL)", "feed-forward attention"):
        _, fn, make = workloads(True, rng)[name]
        found[name] = (fn, make(64, 6))
    try:
        from batchfold.data.molecules import load_esol

        molecules = list(load_esol())
        random.Random(0).shuffle(molecules)
        found["Weave (ESOL)"] = (
            partial(weave_predict, WeaveModel()),
            [molecules[i : i + 64] for i in range(0, 384, 64)],
        )
    except Exception as error:  # no rdkit or no data
        print(f"Weave left out: {type(error).__name__}: {error}")
    model = TreeLSTMClassifier(1000, emb_dim=300, hidden=150)
    trees = [random_tree(rng.randint(2, 60), rng=i, vocab_size=1000) for i in range(512)]
    found["binary Tree-LSTM"] = (partial(tree_node_losses, model), [trees[:256], trees[256:]])
    return found


def measure(fn: Any, batches: list[list[Any]], rounds: int) -> dict[str, Any]:
    """Median recording and call time per batch, graph kept and made anew, alternating."""
    times: dict[str, dict[str, list[float]]] = {
        mode: {"record_s": [], "call_s": []} for mode in ("kept", "new")
    }
    for r in range(rounds + 1):  # the first round warms up (and fills the kept graph)
        for mode in ("kept", "new") if r % 2 else ("new", "kept"):
            records, calls = [], []
            for batch in batches:
                if mode == "new":
                    graphs.forget()
                start = time.perf_counter()
                _, stats = bf.batch_map(fn, batch, return_stats=True)
                calls.append(time.perf_counter() - start)
                records.append(stats.record_s)
            if r:
                times[mode]["record_s"].append(statistics.mean(records))
                times[mode]["call_s"].append(statistics.mean(calls))
    return {
        mode: {name: statistics.median(values) for name, values in fields.items()}
        for mode, fields in times.items()
    }


def summary(results: dict[str, Any]) -> str:
    """The markdown report."""
    machine = results["machine"]
    rows = []
    for name, row in results["workloads"].items():
        kept, new = row["kept"], row["new"]
        rows.append(
            [
                name,
                row["batch"],
                f"{1e3 * kept['record_s']:.1f}",
                f"{1e3 * new['record_s']:.1f}",
                f"{kept['record_s'] / new['record_s']:.2f}",
                f"{1e3 * kept['call_s']:.1f}",
                f"{1e3 * new['call_s']:.1f}",
            ]
        )
    table = markdown_table(
        [
            "workload",
            "batch",
            "record ms, kept graph",
            "record ms, new graph",
            "kept / new",
            "call ms, kept",
            "call ms, new",
        ],
        rows,
    )
    return (
        "# batch_map with its graph kept between calls\n\n"
        f"{machine['cpu']}, {machine['threads']} thread(s), torch {machine['torch']}, "
        f"commit {machine['commit']}, {machine['date']}. One process; each round runs every "
        f"batch with the kept graph and with a new graph, in turn; medians of "
        f"{results['rounds']} rounds. Call: the whole `batch_map` (recording, scheduling, "
        "the forward pass), no backward.\n\n" + table + "\n"
    )


def main() -> None:
    """Run, print, and write JSON and markdown under benchmarks/results/."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rng = random.Random(0)
    torch.manual_seed(0)
    found = {}
    for name, (fn, batches) in cases(rng).items():
        found[name] = {"batch": len(batches[0]), **measure(fn, batches, args.rounds)}
        print(name, found[name], flush=True)
    results = {"machine": describe_machine(args.threads), "rounds": args.rounds, "workloads": found}
    write_results(args.out, "graph-reuse", results, summary(results))


if __name__ == "__main__":
    main()
