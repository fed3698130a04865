"""batch_map's recording cost before and after a change: two source trees, alternating runs.

Five workloads, each timed in a fresh process per tree and round (the trees' ``src`` folders
come first on ``PYTHONPATH``), the two trees in turn, the first of each pair swapped every round
(before, after; after, before; ...): on the 2-vCPU VM the second process of a pair ran about
10% slower than the first (greedy decoding), a bias a fixed order gives to one tree:

- **tiny**: 64 instances of ``lin(torch.as_tensor(x))`` on ``[4]`` vectors (fixed costs);
- **attention**: the feed-forward attention classifier with a cross-entropy, 64 sequences
  ``[T, 16]`` with T 5-100 (``bench_ragged.py``'s workload), forward only;
- **decoding**: ``bench_ragged.py``'s GRU encoder-decoder, batch 64: greedy decoding under
  ``no_grad`` and a training step on the greedy output;
- **tree-lstm**: ``bench_treelstm.py``'s binary Tree-LSTM on random 2-60-leaf trees written
  per tree (no ``bf.function``), a training step at batch 256;
- **weave**: the Weave model written per molecule (``weave_predict``) on ESOL molecules, a
  training step at batch 64 (needs the ESOL data).

    git worktree add /tmp/before <commit>
    python benchmarks/recorder_ab.py /tmp/before/src src [--out DIR]

Writes ``recorder-ab.json`` and ``recorder-ab.md`` to ``--out`` (default: ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WORKLOADS = ("tiny", "attention", "decoding", "tree-lstm", "weave")


def _median_ms(times: list[float]) -> float:
    return statistics.median(times) * 1e3


def tiny() -> dict[str, float]:
    """batch_map of 64 one-layer instances: fixed costs per batch_map."""
    import torch

    import batchfold as bf

    xs = [torch.randn(4) for _ in range(64)]
    lin = torch.nn.Linear(4, 4)
    times, records, schedules = [], [], []
    for i in range(60):
        start = time.perf_counter()
        _, stats = bf.batch_map(lambda x: lin(torch.as_tensor(x)), xs, return_stats=True)
        if i >= 10:
            times.append(time.perf_counter() - start)
            records.append(stats.record_s)
            schedules.append(stats.schedule_s)
    return {
        "batch_ms": _median_ms(times),
        "record_ms": _median_ms(records),
        "schedule_ms": _median_ms(schedules),
    }


def attention() -> dict[str, float]:
    """Feed-forward attention over 64 sequences of lengths 5-100, forward and loss."""
    import torch
    import torch.nn.functional as F

    import batchfold as bf
    from batchfold.models.attention import AttentionClassifier

    torch.manual_seed(0)
    rng = random.Random(0)
    model = AttentionClassifier(in_dim=16, dim=64, hidden=64, n_outputs=5)

    def loss(item: tuple[Any, int]) -> Any:
        return F.cross_entropy(model(torch.as_tensor(item[0])), torch.tensor(item[1]))

    batches = [
        [(torch.randn(rng.randint(5, 100), 16), rng.randrange(5)) for _ in range(64)]
        for _ in range(4)
    ]
    times, records = [], []
    for i in range(12):
        for batch in batches:
            start = time.perf_counter()
            _, stats = bf.batch_map(loss, batch, return_stats=True)
            if i >= 2:
                times.append(time.perf_counter() - start)
                records.append(stats.record_s)
    return {"batch_ms": _median_ms(times), "record_ms": _median_ms(records)}


def decoding() -> dict[str, float]:
    """Greedy decoding (inference) and a training step on the greedy output, batch 64."""
    import torch

    import batchfold as bf
    from bench_ragged import Seq2Seq

    torch.manual_seed(0)
    rng = random.Random(0)
    model = Seq2Seq()
    batches = [
        [[rng.randrange(1, 50) for _ in range(rng.randint(5, 20))] for _ in range(64)]
        for _ in range(2)
    ]
    decode, train = [], []
    for i in range(4):
        for batch in batches:
            start = time.perf_counter()
            with torch.no_grad():
                bf.batch_map(model.decode, batch)
            middle = time.perf_counter()
            losses = bf.batch_map(lambda t: -model.decode(t)[1], batch)
            torch.stack(losses).sum().backward()
            if i:
                decode.append(middle - start)
                train.append(time.perf_counter() - middle)
    return {"decode_ms": _median_ms(decode), "train_ms": _median_ms(train)}


def tree_lstm() -> dict[str, float]:
    """A training step of the binary Tree-LSTM written per tree, batch 256."""
    import torch

    from batchfold.models.tree_lstm import TreeLSTMClassifier
    from bench_treelstm import CLASSES, EMB, HIDDEN, BatchfoldRunner, random_workload

    torch.manual_seed(0)
    model = TreeLSTMClassifier(1000, EMB, HIDDEN, n_classes=CLASSES)
    batches = random_workload().batches(256, 3)
    runner = BatchfoldRunner(model, "depth", fused=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    times, records = [], []
    for i in range(3):
        for batch in batches:
            start = time.perf_counter()
            loss = runner(batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if i:
                times.append(time.perf_counter() - start)
                records.append(runner.stats[-1].record_s)
    return {"step_ms": _median_ms(times), "record_ms": _median_ms(records)}


def weave() -> dict[str, float]:
    """A training step of the Weave model written per molecule (``weave_predict``), batch 64
    of ESOL molecules: three ``torch.as_tensor`` calls and one model call per molecule."""
    from functools import partial

    import torch

    import batchfold as bf
    from batchfold.data.molecules import load_esol
    from batchfold.models.weave import WeaveModel, weave_predict

    torch.manual_seed(0)
    molecules = list(load_esol())
    model = WeaveModel()
    fn = partial(weave_predict, model)
    batches = [molecules[k * 64 : (k + 1) * 64] for k in range(4)]
    times, records = [], []
    for i in range(4):
        for batch in batches:
            start = time.perf_counter()
            predictions, stats = bf.batch_map(fn, batch, return_stats=True)
            torch.stack(predictions).pow(2).sum().backward()
            if i:
                times.append(time.perf_counter() - start)
                records.append(stats.record_s)
    return {"step_ms": _median_ms(times), "record_ms": _median_ms(records)}


def run_one(name: str, threads: int) -> None:
    """Run one workload in this process and print its JSON line."""
    import torch

    torch.set_num_threads(threads)
    found = {
        "tiny": tiny,
        "attention": attention,
        "decoding": decoding,
        "tree-lstm": tree_lstm,
        "weave": weave,
    }
    print(json.dumps(found[name]()))


def measure(
    trees: dict[str, str], rounds: int, threads: int, names: list[str]
) -> list[dict[str, Any]]:
    """Every workload on every tree, alternating trees (and which goes first), ``rounds`` times."""
    rows = []
    for r in range(rounds):
        for name in names:
            for label, src in list(trees.items())[:: -1 if r % 2 else 1]:
                path = [src, str(HERE), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
                env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
                command = [sys.executable, __file__, "--one", name, "--threads", str(threads)]
                out = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
                row = {"round": r, "workload": name, "tree": label, **json.loads(out.stdout)}
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def summary(results: dict[str, Any]) -> str:
    """A markdown table: each measure's median over rounds, before and after."""
    lines = [
        "# Recording cost before and after a change (`recorder_ab.py`)",
        "",
        f"{results['machine']}, {results['threads']} threads; before: `{results['before']}`, "
        f"after: `{results['after']}`; median over {results['rounds']} alternating rounds of "
        "each run's median.",
        "",
        "| workload | measure | before ms | after ms | after / before |",
        "|---|---|---|---|---|",
    ]
    for name in results["workloads"]:
        rows = [r for r in results["rows"] if r["workload"] == name]
        for key in [k for k in rows[0] if k.endswith("_ms")]:
            before = statistics.median(r[key] for r in rows if r["tree"] == "before")
            after = statistics.median(r[key] for r in rows if r["tree"] == "after")
            lines.append(
                f"| {name} | {key[:-3]} | {before:.2f} | {after:.2f} | {after / before:.2f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before", nargs="?", help="the src folder of the tree before")
    parser.add_argument("after", nargs="?", help="the src folder of the tree after")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--machine", default="", help="the machine, for the report")
    parser.add_argument("--out", type=Path, default=HERE / "results", help="report folder")
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--one", choices=WORKLOADS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        run_one(args.one, args.threads)
        return
    if not (args.before and args.after):
        parser.error("give the src folders of the trees before and after")
    trees = {"before": args.before, "after": args.after}
    results = {
        "machine": args.machine or os.uname().nodename,
        "threads": args.threads,
        "rounds": args.rounds,
        "workloads": args.workloads,
        **trees,
        "rows": measure(trees, args.rounds, args.threads, args.workloads),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "recorder-ab.json").write_text(json.dumps(results, indent=1))
    (args.out / "recorder-ab.md").write_text(summary(results))
    print(summary(results))


if __name__ == "__main__":
    main()
