"""Timing helpers and the two plain-PyTorch baselines that batchfold's benchmarks compare against.

A *runner* is a callable taking a batch of trees and returning a scalar loss. The helpers time a
training step (forward, backward, optimizer step) or an inference call (forward only, no
gradients) with warm-up calls first and the median of the repeats reported, measured with
:func:`time.perf_counter`. Each call gets the next batch of a fixed list, so per-batch work
(flattening, scheduling) is part of what is measured.

Run as a script, it compares the naive and the level-batched Tree-LSTM on random trees::

    python benchmarks/baselines.py --threads 2
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import Tensor

import batchfold as bf
from batchfold.data.trees import BinaryTree, random_trees
from batchfold.models.tree_lstm import TreeLSTMClassifier, level_batched_loss, naive_batch_loss

__all__ = [
    "Runner",
    "Timing",
    "make_batches",
    "split_fields",
    "synchronize",
    "time_inference",
    "time_training",
    "timing_fields",
    "training_step",
    "tree_lstm_baselines",
]

Runner = Callable[[Sequence[BinaryTree]], Tensor]
"""Computes the scalar loss of a batch of trees."""


@dataclass(frozen=True)
class Timing:
    """Wall-clock times of repeated calls on batches of a fixed size.

    Arguments:
        times: seconds per call, one per repeat (warm-up calls excluded).
        batch_size: trees per call.

    Example:
        >>> t = Timing([0.5, 0.25, 1.0], batch_size=10)
        >>> t.median_s, t.trees_per_s
        (0.5, 20.0)
    """

    times: list[float]
    batch_size: int

    @property
    def median_s(self) -> float:
        """The median seconds per call."""
        return statistics.median(self.times)

    @property
    def trees_per_s(self) -> float:
        """Throughput at the median: trees per second."""
        return self.batch_size / self.median_s


def timing_fields(timing: Timing) -> dict[str, Any]:
    """A results row's fields for a timing: throughput, median, spread and every time."""
    return {
        "trees_per_s": timing.trees_per_s,
        "median_s": timing.median_s,
        "min_s": min(timing.times),
        "max_s": max(timing.times),
        "times_s": timing.times,
    }


def split_fields(stats: Sequence[bf.Stats]) -> dict[str, Any]:
    """A results row's fields for batchfold's record / schedule / execute split.

    Medians over the timed calls' statistics; ``execute_s`` is the forward's execution, and
    the graph's sizes are those of the last call.
    """
    return {
        "record_s": statistics.median(s.record_s for s in stats),
        "record_us_per_node": 1e6 * statistics.median(s.record_s / s.nodes for s in stats),
        "schedule_s": statistics.median(s.schedule_s for s in stats),
        "execute_s": statistics.median(s.execute_s for s in stats),
        "nodes": stats[-1].nodes,
        "steps": stats[-1].steps,
        "mean_batch": stats[-1].mean_batch,
        "fallbacks": stats[-1].fallbacks,
    }


def synchronize() -> None:
    """Wait for queued GPU work, so that timings cover it (does nothing on CPU only)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def make_batches(
    n_batches: int,
    batch_size: int,
    min_leaves: int = 2,
    max_leaves: int = 60,
    vocab_size: int = 1000,
    n_classes: int = 5,
    seed: int = 0,
) -> list[list[BinaryTree]]:
    """Batches of random trees (uniform split points, leaf counts uniform in a range).

    Arguments:
        n_batches: how many batches.
        batch_size: trees per batch.
        min_leaves: the smallest leaf count.
        max_leaves: the largest leaf count.
        vocab_size: word ids are uniform in ``[0, vocab_size)``.
        n_classes: labels are uniform in ``[0, n_classes)``.
        seed: the random seed.

    Returns:
        A list of ``n_batches`` lists of ``batch_size`` trees.

    Example:
        >>> [len(b) for b in make_batches(3, 4)]
        [4, 4, 4]
    """
    trees = random_trees(
        n_batches * batch_size, min_leaves, max_leaves, seed, vocab_size, n_classes
    )
    return [trees[i * batch_size : (i + 1) * batch_size] for i in range(n_batches)]


def training_step(
    runner: Runner, batch: Sequence[BinaryTree], optimizer: torch.optim.Optimizer
) -> float:
    """One training step: loss, backward pass and optimizer step.

    Arguments:
        runner: computes the batch's loss.
        batch: the trees.
        optimizer: updates the parameters the loss depends on.

    Returns:
        The loss before the step.
    """
    optimizer.zero_grad(set_to_none=True)
    loss = runner(batch)
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def _time(
    call: Callable[[Sequence[BinaryTree]], object],
    batches: Sequence[Sequence[BinaryTree]],
    warmup: int,
    repeats: int,
) -> list[float]:
    """Seconds of each of ``repeats`` calls after ``warmup`` calls, cycling through batches."""
    if not batches:
        raise ValueError("need at least one batch")
    for i in range(warmup):
        call(batches[i % len(batches)])
    synchronize()
    times = []
    for i in range(warmup, warmup + repeats):
        start = time.perf_counter()
        call(batches[i % len(batches)])
        synchronize()
        times.append(time.perf_counter() - start)
    return times


def time_training(
    runner: Runner,
    batches: Sequence[Sequence[BinaryTree]],
    optimizer: torch.optim.Optimizer,
    warmup: int = 1,
    repeats: int = 5,
    restore: bool = True,
) -> Timing:
    """Time training steps (see :func:`training_step`) of a runner.

    The parameters and the optimizer's state are put back afterwards (unless ``restore`` is
    false), so that every measurement starts from the same weights: weights that drift far
    (diverging training) make arithmetic slower and timings meaningless.

    Arguments:
        runner: computes a batch's loss.
        batches: the batches, used in turn (all of the same size).
        optimizer: updates the parameters.
        warmup: untimed steps first.
        repeats: timed steps.
        restore: put the parameters and optimizer state back afterwards.

    Returns:
        The timings.

    Example:
        >>> model = TreeLSTMClassifier(1000, emb_dim=8, hidden=4)
        >>> sgd = torch.optim.SGD(model.parameters(), lr=0.01)
        >>> before = model.output.weight.clone()
        >>> t = time_training(partial(level_batched_loss, model), make_batches(2, 3), sgd)
        >>> len(t.times), t.batch_size, torch.equal(model.output.weight, before)
        (5, 3, True)
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    saved = [p.detach().clone() for p in params] if restore else []
    saved_state = copy.deepcopy(optimizer.state_dict())
    times = _time(partial(training_step, runner, optimizer=optimizer), batches, warmup, repeats)
    if restore:
        with torch.no_grad():
            for p, value in zip(params, saved, strict=True):
                p.copy_(value)
        optimizer.load_state_dict(saved_state)
    return Timing(times, len(batches[0]))


def time_inference(
    runner: Runner,
    batches: Sequence[Sequence[BinaryTree]],
    warmup: int = 1,
    repeats: int = 5,
) -> Timing:
    """Time forward passes of a runner with gradients off.

    Arguments:
        runner: computes a batch's loss (or outputs).
        batches: the batches, used in turn (all of the same size).
        warmup: untimed calls first.
        repeats: timed calls.

    Returns:
        The timings.

    Example:
        >>> model = TreeLSTMClassifier(1000, emb_dim=8, hidden=4)
        >>> t = time_inference(partial(naive_batch_loss, model), make_batches(2, 3), repeats=2)
        >>> len(t.times)
        2
    """

    def call(batch: Sequence[BinaryTree]) -> None:
        with torch.no_grad():
            runner(batch)

    return Timing(_time(call, batches, warmup, repeats), len(batches[0]))


def tree_lstm_baselines(model: TreeLSTMClassifier) -> dict[str, Runner]:
    """The two baseline runners for a Tree-LSTM classifier.

    Arguments:
        model: the classifier both runners use.

    Returns:
        ``{"naive": ..., "level-batched": ...}``: :func:`naive_batch_loss` and
        :func:`level_batched_loss` bound to ``model``.
    """
    return {
        "naive": partial(naive_batch_loss, model),
        "level-batched": partial(level_batched_loss, model),
    }


def main(argv: Sequence[str] | None = None) -> None:
    """Print training (and optionally inference) trees/s of both baselines per batch size."""
    parser = argparse.ArgumentParser(
        description="Time the naive and level-batched Tree-LSTM baselines."
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32, 256])
    parser.add_argument("--min-leaves", type=int, default=2)
    parser.add_argument("--max-leaves", type=int, default=60)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--emb", type=int, default=300)
    parser.add_argument("--hidden", type=int, default=150)
    parser.add_argument("--inference", action="store_true", help="also time inference")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = TreeLSTMClassifier(args.vocab, args.emb, args.hidden, n_classes=5)
    # The loss is a sum over ~15,000 nodes at batch size 256: a small rate keeps the weights sane.
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    runners = tree_lstm_baselines(model)
    print(
        f"Tree-LSTM, random trees with {args.min_leaves}-{args.max_leaves} leaves, "
        f"embedding {args.emb}, hidden {args.hidden}, {torch.get_num_threads()} threads"
    )
    print(f"{'mode':<10} {'batch':>5} " + " ".join(f"{name:>14}" for name in runners))
    modes = ["training", "inference"] if args.inference else ["training"]
    for mode in modes:
        for batch_size in args.batch_sizes:
            # About the same number of trees per measurement at every batch size.
            repeats = max(3, min(30, 256 // batch_size))
            batches = make_batches(
                repeats + 1, batch_size, args.min_leaves, args.max_leaves, args.vocab, seed=1
            )
            rates = []
            for runner in runners.values():
                if mode == "training":
                    timing = time_training(runner, batches, optimizer, repeats=repeats)
                else:
                    timing = time_inference(runner, batches, repeats=repeats)
                rates.append(timing.trees_per_s)
            print(f"{mode:<10} {batch_size:>5} " + " ".join(f"{r:>14.1f}" for r in rates))


if __name__ == "__main__":
    main()
