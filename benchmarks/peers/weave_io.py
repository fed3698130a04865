"""The command line, molecule file and timing loop shared by the peer Weave benchmarks.

This module needs only the standard library and NumPy (and ``benchmarks/memory.py``), so that
``dgllife_weave.py`` and ``pyg_weave.py`` can import it from their own virtual environments
(``benchmarks/.peers/<peer>``) without batchfold. The file formats are described in
``dgllife_weave.py``'s docstring. The training mode of the peers (``pyg_weave_train.py``,
``dgllife_weave_train.py``) shares its command line and loop here: :func:`parse_train_args`
and :func:`train_to_accuracy`, batchfold's ``esol`` training written out.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
from passes import timed_passes  # noqa: E402  (beside this file; it reads benchmarks/memory.py)

import memory  # noqa: E402  (benchmarks/memory.py, on the path above)


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
    p.add_argument(
        "--serve",
        action="store_true",
        help="time one pass per JSON command read from standard input (see weave_io.serve)",
    )
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
    inside the timed step). ``count`` is the number of molecules. With ``--serve``, passes are
    timed one per command instead (:func:`serve`).
    """
    if args.serve:
        serve(system, version, args.threads, count, batches, train_step, infer_step)
        return
    for mode in args.modes.replace(",", " ").split():
        if mode not in ("prebuilt", "inloop"):
            raise SystemExit(f"unknown mode {mode!r} (prebuilt, inloop)")
        for size in [int(s) for s in args.batch_sizes.split(",") if s]:
            n_batches = count // size
            if n_batches == 0:
                raise SystemExit(f"{count} molecules: not one full batch of {size}")
            items, get = batches(mode, [range(b * size, (b + 1) * size) for b in range(n_batches)])
            train_times, infer_times, peak = timed_passes(
                items,
                get,
                None if args.no_train else train_step,
                None if args.no_infer else infer_step,
                list(items) * args.warmup,
                args.repeats,
            )
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


def serve(
    system: str,
    version: str,
    threads: int,
    count: int,
    batches: Batches,
    train_step: Callable[[Any], Any],
    infer_step: Callable[[Any], Any],
) -> None:
    """Time one pass over the molecules per command read from standard input, until it closes.

    A benchmark that times several systems in turns (``bench_weave.py``) keeps the peer
    loaded and asks for its passes one at a time, between the other systems' passes, so that
    a slow minute of a shared machine falls on every system alike. Once loaded, this prints
    ``{"ready": true, ...}`` with the system, its version and its torch ``threads``. A command is one JSON line: ``mode`` (``prebuilt`` or
    ``inloop``), ``batch_size`` and ``training`` (a training pass, else inference); the answer
    is one JSON line: the pass's ``seconds``, its ``molecules`` and its peak memory fields.
    The batches of a mode and size are made on its first command, before its timing starts.
    """
    ready = {"ready": True, "system": system, "version": version, "threads": threads}
    print(json.dumps(ready), flush=True)
    made: dict[tuple[str, int], tuple[list[Any], Callable[[Any], Any]]] = {}
    for line in sys.stdin:
        command = json.loads(line)
        mode, size = command["mode"], int(command["batch_size"])
        if (mode, size) not in made:
            n_batches = count // size
            if mode not in ("prebuilt", "inloop") or n_batches == 0:
                raise SystemExit(f"cannot serve {mode!r} batches of {size} from {count} molecules")
            made[mode, size] = batches(
                mode, [range(b * size, (b + 1) * size) for b in range(n_batches)]
            )
        items, get = made[mode, size]
        step = train_step if command["training"] else infer_step
        with memory.PeakMemory() as peak:
            start = time.perf_counter()
            for item in items:
                step(get(item))
            seconds = time.perf_counter() - start
        answer = {"seconds": seconds, "molecules": len(items) * size, **peak.as_dict()}
        print(json.dumps(answer), flush=True)


# -- training to accuracy (the *_weave_train.py scripts) ---------------------------------------


def parse_train_args(description: str | None, argv: list[str] | None = None) -> argparse.Namespace:
    """The training scripts' command line: three molecule files, the weights, the loop's options.

    The defaults are ``batchfold train esol``'s.
    """
    p = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawTextHelpFormatter
    )
    for split in ("train", "dev", "test"):
        p.add_argument(split, help=f"the {split} molecules (.npz, see dgllife_weave.py)")
    p.add_argument("--weights", required=True, help="batchfold's initial weights (.npz)")
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--lr", type=float, default=1e-3, help="Adam's rate at epoch 1")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--eval-batch-size", type=int, default=256)
    p.add_argument("--seed", type=int, default=0, help="seed of the per-epoch shuffles")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--keep", choices=("best", "last"), default="best", help="epoch tested")
    return p.parse_args(argv)


def cosine_scale(epoch: int, epochs: int) -> float:
    """batchfold's ``--lr-schedule cosine`` factor for ``epoch`` (from 1): 1 down to 0."""
    if epochs <= 1:
        return 1.0
    return 0.5 * (1.0 + math.cos(math.pi * (epoch - 1) / (epochs - 1)))


def shuffled_batches(n_items: int, batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """One epoch's batches of item indices, as batchfold's training loop draws them."""
    order = np.random.default_rng([seed, epoch]).permutation(n_items).tolist()
    return [order[i : i + batch_size] for i in range(0, n_items, batch_size)]


def train_to_accuracy(
    args: argparse.Namespace,
    system: str,
    version: str,
    model: Any,
    predict: Callable[[str, list[int]], Any],
    targets: dict[str, Any],
) -> None:
    """Train as ``batchfold train esol`` does and print one JSON line per epoch, then a summary.

    The targets are standardised with the training split's mean and (n - 1) standard
    deviation; the loss is the summed squared error of the standardised targets; Adam
    (``args.lr``, no weight decay) with the rate on a cosine from ``args.lr`` at epoch 1 to 0
    at the last; the batches of :func:`shuffled_batches`. After each epoch the dev RMSE and
    MAE (log units); the epoch of the lowest dev RMSE (the first, on a tie) is tested, or the
    last epoch with ``--keep last``.

    Arguments:
        args: the options of :func:`parse_train_args`.
        system: the peer's name for the output.
        version: its library versions.
        model: the ``torch.nn.Module`` whose parameters train.
        predict: ``predict(split, indices)``: the outputs ``[len(indices), n_tasks]`` of those
            molecules of ``"train"``, ``"dev"`` or ``"test"``, batched by the peer.
        targets: each split's targets, ``[n, n_tasks]`` float32 (NumPy).
    """
    import torch

    train = targets["train"].astype(np.float64)
    mean = float(train.mean())
    std = float(train.std(ddof=1)) if train.size > 1 else 0.0
    std = std if std > 0 else 1.0
    y = (torch.from_numpy(targets["train"]) - mean) / std  # float32, as batchfold's loss

    def evaluate(split: str) -> dict[str, float]:
        model.eval()
        n, size = len(targets[split]), args.eval_batch_size
        with torch.no_grad():
            outputs = torch.cat(
                [predict(split, list(range(i, min(i + size, n)))) for i in range(0, n, size)]
            )
        error = (
            outputs[:, 0].double() * std + mean - torch.from_numpy(targets[split][:, 0]).double()
        )
        return {"rmse": error.pow(2).mean().sqrt().item(), "mae": error.abs().mean().item()}

    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    start_dev = evaluate("dev")
    best_rmse, best_epoch, best_dev, best_state = math.inf, 0, start_dev, None
    run_start = time.perf_counter()
    train_seconds = 0.0
    for epoch in range(1, args.epochs + 1):
        scale = cosine_scale(epoch, args.epochs)
        for group in optimizer.param_groups:
            group["lr"] = args.lr * scale
        model.train()
        total, t0 = 0.0, time.perf_counter()
        for indices in shuffled_batches(len(y), args.batch_size, args.seed, epoch):
            optimizer.zero_grad(set_to_none=True)
            loss = (predict("train", indices) - y[indices]).pow(2).sum()
            loss.backward()
            optimizer.step()
            total += loss.item()
        seconds = time.perf_counter() - t0
        train_seconds += seconds
        dev = evaluate("dev")
        line = {"epoch": epoch, "lr_scale": scale, "train_loss": total / len(y), "seconds": seconds}
        print(json.dumps({**line, "dev": dev}), flush=True)
        if dev["rmse"] < best_rmse or args.keep == "last":
            best_rmse, best_epoch, best_dev = dev["rmse"], epoch, dev
            best_state = copy.deepcopy(model.state_dict())
    if best_state is not None:
        model.load_state_dict(best_state)
    summary = {
        "system": system,
        "best_epoch": best_epoch,
        "dev": best_dev,
        "test": evaluate("test"),
        "dev_at_start": start_dev,
        "target_mean": mean,
        "target_std": std,
        "epochs": args.epochs,
        "train_seconds": train_seconds,
        "run_seconds": time.perf_counter() - run_start,
        "threads": args.threads,
        "version": version,
    }
    print(json.dumps(summary), flush=True)


def train_peer(
    args: argparse.Namespace,
    system: str,
    version: str,
    build_model: Callable[[Any, dict[str, Any]], Any],
    to_graph: Callable[..., Any],
    batch: Callable[[list[Any]], Any],
) -> None:
    """Build a peer's model from batchfold's weights and train it on the three splits.

    Arguments:
        args: the options of :func:`parse_train_args`.
        system, version: the peer's name and library versions, for the output.
        build_model: ``build_model(config, weights)``, the peer's model (with ``predict``).
        to_graph: one molecule's graph from its ``(atoms, pairs, pair index, target)``.
        batch: the peer's batch of a list of graphs.
    """
    import torch

    config, arrays = load_weights(args.weights)
    model = build_model(config, {k: torch.from_numpy(v) for k, v in arrays.items()})
    molecules = {s: load_molecules(getattr(args, s)) for s in ("train", "dev", "test")}
    graphs = {s: [to_graph(*m) for m in ms] for s, ms in molecules.items()}
    targets = {s: np.stack([m[3] for m in ms]) for s, ms in molecules.items()}

    def predict(split: str, indices: list[int]) -> Any:
        return model.predict(batch([graphs[split][i] for i in indices]))

    train_to_accuracy(args, system, version, model, predict, targets)
