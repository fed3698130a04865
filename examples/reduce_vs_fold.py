"""Learn ``sum`` and ``min`` of integer lists with ``Reduce`` (a balanced tree) and with ``Fold``
(left to right), the comparison of TensorFlow Fold's documentation.

Each list of digits is embedded element by element, combined into one vector by a learned
layer, either pairwise as a balanced tree (``Reduce``: about log2(n) steps deep) or one
element at a time (``Fold``: n steps deep), and read out: ``sum`` by regression, ``min`` as a
class 0-9. Run with ``python examples/reduce_vs_fold.py``; it prints, for each task and each
combinator, the test error, the depth of the batched plan and the training time.
"""

from __future__ import annotations

import random
import time
from typing import Any

import torch
import torch.nn.functional as F

from batchfold.blocks import (
    FC,
    Concat,
    Embedding,
    Fold,
    Function,
    Map,
    Reduce,
    Scalar,
    TensorType,
    Zeros,
    compile,
)

DIM = 32


def make_model(combinator: str, outputs: int) -> Any:
    """Digits -> vectors -> one vector (Reduce or Fold) -> ``outputs`` numbers."""
    digits = Map(Scalar("int64") >> Embedding(10, DIM))
    combine = Concat() >> FC(2 * DIM, DIM, activation=torch.tanh)
    if combinator == "reduce":
        whole = digits >> Reduce(combine)
    else:
        whole = digits >> Fold(combine, Zeros(TensorType((DIM,))))
    readout = FC(DIM, DIM, activation=torch.relu) >> FC(DIM, outputs, activation=None)
    if outputs == 1:
        readout = readout >> Function(_first_column)
    return compile(whole >> readout)


def _first_column(x: torch.Tensor) -> torch.Tensor:
    return x[:, 0]  # [n, 1] -> [n]


def lists(rng: random.Random, count: int, low: int, high: int) -> list[list[int]]:
    """``count`` lists of digits, lengths uniform in ``[low, high]``."""
    return [[rng.randrange(10) for _ in range(rng.randint(low, high))] for _ in range(count)]


def loss_and_error(task: str, out: torch.Tensor, batch: list[list[int]]) -> tuple[Any, float]:
    """The training loss, and the error reported (mean absolute error or error rate)."""
    if task == "sum":
        target = torch.tensor([float(sum(x)) for x in batch])
        return F.mse_loss(out, target), (out.detach() - target).abs().mean().item()
    target = torch.tensor([min(x) for x in batch])
    error = (out.detach().argmax(-1) != target).float().mean().item()
    return F.cross_entropy(out, target), error


def train(task: str, combinator: str, seed: int = 0) -> None:
    """Train one model and print its test error, plan depth and time."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    model = make_model(combinator, 1 if task == "sum" else 10)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    train_set, test_set = lists(rng, 3000, 1, 16), lists(rng, 500, 1, 16)
    start = time.perf_counter()
    for _ in range(12):
        rng.shuffle(train_set)
        for i in range(0, len(train_set), 50):
            batch = train_set[i : i + 50]
            out, _ = model(batch)
            loss, _ = loss_and_error(task, out, batch)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    seconds = time.perf_counter() - start
    with torch.no_grad():
        out, _ = model(test_set)
    _, error = loss_and_error(task, out, test_set)
    stats = model.last_stats
    assert stats is not None
    what = "mean abs error" if task == "sum" else "error rate"
    print(
        f"{task:>3s} with {combinator:<6s}: test {what} {error:6.3f}, "
        f"{stats.steps:3d} batched steps for the test set, trained in {seconds:4.1f} s"
    )


def baselines() -> None:
    """The errors of constant predictions, for scale."""
    rng = random.Random(1)
    sums = [sum(x) for x in lists(rng, 5000, 1, 16)]
    mean = sum(sums) / len(sums)
    mins = [min(x) for x in lists(rng, 5000, 1, 16)]
    common = max(set(mins), key=mins.count)
    print(
        f"lists of 1-16 digits; predicting the mean sum gives mean abs error "
        f"{sum(abs(s - mean) for s in sums) / len(sums):.2f}, predicting min = {common} "
        f"gives error rate {1 - mins.count(common) / len(mins):.3f}"
    )


def main() -> None:
    """Both tasks with both combinators."""
    torch.set_num_threads(1)
    baselines()
    for task in ("sum", "min"):
        for combinator in ("reduce", "fold"):
            train(task, combinator)


if __name__ == "__main__":
    main()
