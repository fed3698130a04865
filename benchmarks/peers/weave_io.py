"""The command line, molecule file and timing loop shared by the peer Weave benchmarks.

This module needs only the standard library and NumPy (and ``benchmarks/memory.py``), so that
``dgllife_weave.py`` and ``pyg_weave.py`` can import it from their own virtual environments
(``benchmarks/.peers/<peer>``) without batchfold. The file formats are described in
``dgllife_weave.py``'s docstring.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import memory  # noqa: E402  (benchmarks/memory.py: peak resident memory, standard library only)


def parse_args(description: str | None, argv: list[str] | None = None) -> argparse.Namespace:
    """The peer scripts' command line (see ``dgllife_weave.py``'s docstring)."""
    p = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("molecules", help="molecule file (.npz, see dgllife_weave.py)")
    p.add_argument("--weights", required=True, help="batchfold's initial weights (.npz)")
    p.add_argument("--batch-sizes", default="64,256")
    p.add_argument("--modes", default="prebuilt,inloop")
    p.add_argument("--repeats", type=int, default=3, help="timed passes")
    p.add_argument("--warmup", type=int, default=1, help="untimed passes before timing")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument(
        "--loss-only",
        action="store_true",
        help="print the summed loss, and the loss after one SGD step on all molecules",
    )
    p.add_argument("--no-train", action="store_true", help="time inference only")
    p.add_argument("--no-infer", action="store_true", help="time training only")
    return p.parse_args(argv)


def load_molecules(path: str) -> list[tuple[Any, Any, Any, Any]]:
    """The molecules of a file as ``(atom features, pair features, pair index, target)``."""
    data = np.load(path)
    atoms, pairs = data["atom_offsets"], data["pair_offsets"]
    return [
        (
            data["atom_features"][atoms[m] : atoms[m + 1]],
            data["pair_features"][pairs[m] : pairs[m + 1]],
            data["pair_index"][pairs[m] : pairs[m + 1]],
            data["target"][m],
        )
        for m in range(len(atoms) - 1)
    ]


def start_torch(threads: int) -> Any:
    """PyTorch with ``threads`` intra-op (and, once per process, inter-op) threads."""
    import torch

    torch.set_num_threads(threads)
    with contextlib.suppress(RuntimeError):  # already set in this process
        torch.set_num_interop_threads(threads)
    return torch


def load_weights(path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The model's configuration and its weights by ``state_dict`` name (NumPy arrays)."""
    stored = np.load(path)
    config = json.loads(str(stored["config"]))
    return config, {k: stored[k].copy() for k in stored.files if k != "config"}


Batches = Callable[[str, list[range]], tuple[list[Any], Callable[[Any], Any]]]


def time_modes(
    args: argparse.Namespace,
    system: str,
    version: str,
    count: int,
    batches: Batches,
    train_step: Callable[[Any], Any],
    infer_step: Callable[[Any], Any],
) -> None:
    """Time every mode and batch size of ``args`` and print one JSON line for each.

    ``batches(mode, spans)`` gives a mode's batches of the molecules numbered in each span and
    how a step gets its input from one (``prebuilt``: batched beforehand; ``inloop``: batched
    inside the timed step). ``count`` is the number of molecules.
    """
    for mode in args.modes.replace(",", " ").split():
        if mode not in ("prebuilt", "inloop"):
            raise SystemExit(f"unknown mode {mode!r} (prebuilt, inloop)")
        for size in [int(s) for s in args.batch_sizes.split(",") if s]:
            n_batches = count // size
            if n_batches == 0:
                raise SystemExit(f"{count} molecules: not one full batch of {size}")
            items, get = batches(mode, [range(b * size, (b + 1) * size) for b in range(n_batches)])
            train_times, infer_times = [], []
            with memory.PeakMemory() as peak:  # warm-up and timed passes
                for _ in range(args.warmup):
                    for it in items:
                        if not args.no_train:
                            train_step(get(it))
                        if not args.no_infer:
                            infer_step(get(it))
                for _ in range(args.repeats):
                    if not args.no_train:
                        t0 = time.perf_counter()
                        for it in items:
                            train_step(get(it))
                        train_times.append(time.perf_counter() - t0)
                    if not args.no_infer:
                        t0 = time.perf_counter()
                        for it in items:
                            infer_step(get(it))
                        infer_times.append(time.perf_counter() - t0)
            n = n_batches * size
            tr = statistics.median(train_times) if train_times else None
            inf = statistics.median(infer_times) if infer_times else None
            line = {
                "system": system,
                "mode": mode,
                "batch_size": size,
                "train_molecules_per_s": n / tr if tr else None,
                "infer_molecules_per_s": n / inf if inf else None,
                "median_s": tr,
                "infer_median_s": inf,
                "repeats": args.repeats,
                "warmup": args.warmup,
                "molecules_per_pass": n,
                "train_times_s": train_times,
                "infer_times_s": infer_times,
                **peak.as_dict(),
                "threads": args.threads,
                "version": version,
            }
            print(json.dumps(line), flush=True)
