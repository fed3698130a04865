"""The benchmark suite: every benchmark and every installed peer in one run, one results file.

Runs, each in a fresh process so that one's memory does not count against the next:

* ``bench_treelstm.py``: the Tree-LSTM on random, complete and SST trees; naive, hand-written
  level batching, batchfold (``batch_map`` and blocks, each scheduler), and the peers DyNet
  (autobatch none, agenda, depth) and DGL;
* ``bench_fold.py``: TensorFlow Fold's ICLR 2017 benchmark (batchfold's ``batch_map`` and
  blocks, with DyNet);
* ``bench_schedule.py``: the schedulers alone, 10^3 to 10^6 nodes;
* ``bench_tagger_parser.py``: the BiLSTM tagger and greedy parser on UD EWT, where present.

A peer that is not installed is named as such and the suite carries on; so does a benchmark
that fails (its error is kept in the results). It then writes under ``benchmarks/results/``
one JSON file (the machine, thread count, library and peer versions, commit, date, and every
configuration's median, spread, peak memory, FLOP/s fraction and batchfold's time split), a
markdown report that opens with the issue's targets, and PNG plots.

    python benchmarks/run_suite.py --quick     # make bench
    python benchmarks/run_suite.py             # make bench-full
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from machine import describe_machine, markdown_table
from peer_runner import PeerUnavailable, peer_python

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
# name: (script, stem of the results files it writes)
BENCHMARKS = {
    "treelstm": ("bench_treelstm.py", "treelstm"),
    "fold": ("bench_fold.py", "fold"),
    "schedule": ("bench_schedule.py", "schedule"),
    "tagger_parser": ("bench_tagger_parser.py", "tagger-parser"),
}
PEER_VERSIONS = {
    "dynet": "from importlib.metadata import version; print('dynet38', version('dyNET38'))",
    "dgl": "import dgl, torch; print('dgl', dgl.__version__, 'torch', torch.__version__)",
}


def peer_status() -> dict[str, str]:
    """``"ok (version)"`` or ``"peer not installed: ..."`` for each peer."""
    status = {}
    for peer, probe in PEER_VERSIONS.items():
        try:
            python = peer_python(peer)
        except PeerUnavailable as error:
            status[peer] = str(error)
            continue
        done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
        version = done.stdout.strip().splitlines()[-1:]  # after any first-import messages
        status[peer] = f"ok ({version[0]})" if done.returncode == 0 and version else "ok"
    return status


def run_benchmark(
    name: str, quick: bool, threads: int, folder: Path, extra: Sequence[str]
) -> tuple[dict[str, Any] | None, str | None, float]:
    """Run one benchmark script in a fresh process; its results, its error, its seconds."""
    script = HERE / BENCHMARKS[name][0]
    command = [sys.executable, str(script), "--threads", str(threads), "--out", str(folder)]
    command += (["--quick"] if quick else []) + list(extra)
    print(f"\n=== {name}: {' '.join(command[1:])}", flush=True)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=HERE.parent)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        return None, f"{name} failed with exit status {done.returncode} (see its output)", seconds
    return json.loads((folder / f"{_stem(name, quick)}.json").read_text()), None, seconds


def targets(suite: dict[str, Any]) -> list[list[str]]:
    """The issue's targets on this CPU, each with what this run measured.

    batchfold is judged by its best system (front end and scheduler), which each row names:
    the Tree-LSTM targets by the fastest batchfold system at training on random trees at
    batch size 256, Fold's by the fastest one in full dynamic mode at the largest batch size.
    """
    out: list[list[str]] = []
    tree = suite["benchmarks"].get("treelstm")
    if tree:
        rows = {
            r["system"]: r
            for r in tree["rows"]
            if r["workload"] == "random 2-60 leaves"
            and r["mode"] == "training"
            and r["batch_size"] == 256
        }
        hand = rows.get("hand-written level batching")
        mine = {name: r for name, r in rows.items() if name.startswith("batchfold")}
        if mine:
            best = max(mine, key=lambda name: mine[name]["trees_per_s"])
            out += treelstm_targets(best, mine, hand)
            out += naive_speedup_targets(tree["rows"], best)
    fold = suite["benchmarks"].get("fold")
    if fold:
        out += fold_speedup_targets(fold["rows"])
    return out


def treelstm_targets(
    best: str, mine: dict[str, dict[str, Any]], hand: dict[str, Any] | None
) -> list[list[str]]:
    """Tree-LSTM training, random trees, b=256: the best batchfold system's targets."""
    r = mine[best]
    out = []
    if hand:
        ratio = r["trees_per_s"] / hand["trees_per_s"]
        others = ", ".join(
            f"{name} {o['trees_per_s'] / hand['trees_per_s']:.2f}x"
            for name, o in mine.items()
            if name != best
        )
        text = f"{ratio:.2f}x ({best}" + (f"; others: {others})" if others else ")")
        out.append(["batchfold >= 1.0x hand-written", text, _met(ratio >= 1.0)])
    if "schedule_s" in r:
        share = r["schedule_s"] / r["median_s"]
        where = ", ".join(
            f"{k.removesuffix('_s')} {100 * r[k] / r['median_s']:.0f}%"
            for k in ("record_s", "schedule_s", "execute_s")
        )
        out += [
            [
                "batchfold: scheduling < 10% of the step",
                f"{100 * share:.1f}% ({best})",
                _met(share < 0.1),
            ],
            [
                "batchfold: >= 50% of matmul FLOP/s",
                f"{100 * r['flops_fraction']:.0f}% ({best}; step: {where})",
                _met(r["flops_fraction"] >= 0.5),
            ],
        ]
    return out


def naive_speedup_targets(rows: list[dict[str, Any]], system: str) -> list[list[str]]:
    """Tree-LSTM training on random trees: ``system``'s speedup over naive grows with batch."""
    naive = {
        r["batch_size"]: r
        for r in rows
        if (r["workload"], r["mode"], r["system"])
        == ("random 2-60 leaves", "training", "naive per-tree")
    }
    points = sorted(
        (r["batch_size"], r["trees_per_s"] / naive[r["batch_size"]]["trees_per_s"])
        for r in rows
        if (r["workload"], r["mode"], r["system"]) == ("random 2-60 leaves", "training", system)
        and r["batch_size"] in naive
    )
    if len(points) < 2:
        return []
    text = ", ".join(f"b={b}: {s:.1f}x" for b, s in points)
    return [
        [
            "Tree-LSTM batchfold: speedup over naive grows",
            f"{text} ({system})",
            _met(_grows(points)),
        ]
    ]


def fold_speedup_targets(rows: list[dict[str, Any]]) -> list[list[str]]:
    """Fold's speedup over ``manual`` at batch size 1 grows with batch size (full dynamic).

    Per state size, judged on the batchfold system with the least time per tree at the
    largest batch size.
    """
    out = []
    for state in sorted({r["state"] for r in rows}, reverse=True):
        mine = [r for r in rows if r["state"] == state]
        base = next((r for r in mine if r["system"] == "manual" and r["batch_size"] == 1), None)
        ours = [
            r for r in mine if r["system"].startswith("batchfold") and r["mode"] == "full dynamic"
        ]
        if base is None or not ours:
            continue
        largest = max(r["batch_size"] for r in ours)
        best = min((r for r in ours if r["batch_size"] == largest), key=lambda r: r["ms_per_tree"])[
            "system"
        ]
        points = sorted(
            (r["batch_size"], base["ms_per_tree"] / r["ms_per_tree"])
            for r in ours
            if r["system"] == best
        )
        if len(points) < 2:
            continue
        text = ", ".join(f"b={b}: {s:.1f}x" for b, s in points)
        out.append(
            [
                f"Fold state {state}, batchfold full dynamic: speedup grows",
                f"{text} ({best})",
                _met(_grows(points)),
            ]
        )
    return out


def _grows(points: list[tuple[int, float]]) -> bool:
    return all(b[1] >= a[1] for a, b in zip(points, points[1:], strict=False))


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def report(suite: dict[str, Any], summaries: dict[str, str]) -> str:
    """The suite's markdown: machine, peers, targets, then each benchmark's own report."""
    m = suite["machine"]
    lines = [
        f"# Benchmark suite ({'quick' if suite['quick'] else 'full'})\n",
        f"{m['cpu']}, {m['cpus']} CPUs, {m['threads']} threads, python {m['python']}, "
        f"torch {m['torch']}, numpy {m['numpy']}, commit {m['commit']}, {m['date']}\n",
        "Peers: " + "; ".join(f"{k}: {v}" for k, v in suite["peers"].items()) + "\n",
        "Seconds per benchmark: "
        + ", ".join(f"{k} {v:.0f}" for k, v in suite["seconds"].items())
        + "\n",
    ]
    if suite["errors"]:
        lines.append("Errors: " + "; ".join(suite["errors"]) + "\n")
    rows = targets(suite)
    if rows:
        lines.append(
            "## Targets\n\nbatchfold is judged by its best system (front end and scheduler), "
            "named in each row.\n\n" + markdown_table(["target", "measured", ""], rows) + "\n"
        )
    lines += [_demote(text) for text in summaries.values()]
    return "\n".join(lines)


def _demote(markdown: str) -> str:
    """Every heading one level down, to nest a benchmark's report in the suite's."""
    return "\n".join("#" + line if line.startswith("#") else line for line in markdown.split("\n"))


def main(argv: Sequence[str] | None = None) -> None:
    """Run the suite and write its JSON, markdown and plots."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the quick suite (make bench)")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS), help="run only these")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for the results")
    parser.add_argument(
        "--pass",
        dest="passed",
        nargs="*",
        default=[],
        metavar="BENCH:ARG",
        help="an extra argument for one benchmark, e.g. fold:--repeats=1",
    )
    args = parser.parse_args(argv)
    status = peer_status()
    for peer, state in status.items():
        print(f"{peer}: {state}")
    suite: dict[str, Any] = {
        "suite": "quick" if args.quick else "full",
        "quick": args.quick,
        "machine": describe_machine(args.threads),
        "peers": status,
        "benchmarks": {},
        "seconds": {},
        "errors": [],
    }
    summaries: dict[str, str] = {}
    present = [name for name, (script, _) in BENCHMARKS.items() if (HERE / script).exists()]
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.only or present:
            extra = [a.split(":", 1)[1] for a in args.passed if a.startswith(name + ":")]
            results, error, seconds = run_benchmark(
                name, args.quick, args.threads, Path(scratch), extra
            )
            suite["seconds"][name] = seconds
            if error:
                suite["errors"].append(error)
                continue
            suite["benchmarks"][name] = results
            summaries[name] = (Path(scratch) / f"{_stem(name, args.quick)}.md").read_text()
    stem = "suite-quick" if args.quick else "suite"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(suite, indent=1))
    (args.out / f"{stem}.md").write_text(report(suite, summaries))
    from plots import all_plots

    plots = all_plots(suite, args.out / f"plots-{stem}")
    print(f"\nwrote {args.out / stem}.json, .md and {len(plots)} plots in plots-{stem}/")
    if suite["errors"]:
        print("errors: " + "; ".join(suite["errors"]))


def _stem(name: str, quick: bool) -> str:
    return BENCHMARKS[name][1] + ("-quick" if quick else "")


if __name__ == "__main__":
    main()
