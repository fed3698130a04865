"""The roofline of a workload: the time its matrix multiplies alone would take on this machine.

A workload's model FLOPs are those of its matrix multiplies: ``2 * rows * in * out`` per
linear layer applied to ``rows`` vectors in the forward pass, and twice that again in training
(the products for the input gradient and for the weight gradient), so training costs 3x the
forward. Element-wise ops, gathers and the optimizer are not counted.

:class:`MatmulRates` times ``torch.mm`` at the shapes a workload uses, with the thread count in
force: ``(rows x in) @ (in x out)`` forward, ``(rows x out) @ (out x in)`` for the input
gradient and ``(out x rows) @ (rows x in)`` for the weight gradient, as autograd runs them for a
linear layer. Row counts are rounded to a power of two (times are scaled linearly from there)
and capped, so that a handful of measurements covers every step size. A workload lists its
matmuls as :class:`Matmul` values (one per batched step of the best hand-written execution);
:func:`roofline` gives its FLOPs and the seconds those matmuls take at the measured rates.
Achieved FLOP/s = FLOPs / measured step time; its fraction of the measured matmul FLOP/s is
``roofline seconds / measured seconds``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import torch

Product = Literal["forward", "grad_input", "grad_weight"]


@dataclass(frozen=True)
class Matmul:
    """One linear layer applied to ``rows`` vectors at once: ``[rows, inp] -> [rows, out]``.

    Example:
        >>> Matmul(rows=10, inp=4, out=3).flops
        240
    """

    rows: int
    inp: int
    out: int

    @property
    def flops(self) -> int:
        """Multiply-adds times two, of the forward product."""
        return 2 * self.rows * self.inp * self.out


class MatmulRates:
    """Measured ``torch.mm`` times at bucketed shapes, cached per shape.

    Arguments:
        dtype: the element type of the products.
        device: where they run.
        max_rows: row counts above this are timed at ``max_rows`` and scaled linearly.
        min_seconds: each measurement repeats the product for at least this long, three times,
            and keeps the fastest (the attainable rate).

    Example:
        >>> rates = MatmulRates(max_rows=8, min_seconds=0.0)
        >>> rates.seconds("forward", 6, 4, 4) > 0
        True
    """

    def __init__(
        self,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        max_rows: int = 2048,
        min_seconds: float = 0.02,
    ) -> None:
        self.dtype, self.device = dtype, torch.device(device)
        self.max_rows, self.min_seconds = max_rows, min_seconds
        self.cache: dict[tuple[Product, int, int, int], float] = {}

    def bucket(self, rows: int) -> int:
        """The power of two nearest ``rows`` (in log scale), at most ``max_rows``."""
        return min(2 ** round(math.log2(max(rows, 1))), self.max_rows)

    def seconds(self, product: Product, rows: int, inp: int, out: int) -> float:
        """Seconds of one product of a linear layer ``inp -> out`` over ``rows`` vectors."""
        bucket = self.bucket(rows)
        key = (product, bucket, inp, out)
        if key not in self.cache:
            self.cache[key] = self._measure(product, bucket, inp, out)
        return self.cache[key] * rows / bucket

    def _measure(self, product: Product, rows: int, inp: int, out: int) -> float:
        make = {"dtype": self.dtype, "device": self.device}
        if product == "forward":  # x @ W.t(), W stored [out, inp] as in nn.Linear
            a, b = torch.randn(rows, inp, **make), torch.randn(out, inp, **make).t()
        elif product == "grad_input":  # grad_y @ W
            a, b = torch.randn(rows, out, **make), torch.randn(out, inp, **make)
        else:  # grad_y.t() @ x
            a, b = torch.randn(rows, out, **make).t(), torch.randn(rows, inp, **make)
        torch.mm(a, b)
        _sync(self.device)
        start = time.perf_counter()
        torch.mm(a, b)
        _sync(self.device)
        once = max(time.perf_counter() - start, 1e-7)
        reps = max(1, math.ceil(self.min_seconds / once))
        best = math.inf
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(reps):
                torch.mm(a, b)
            _sync(self.device)
            best = min(best, (time.perf_counter() - start) / reps)
        return best

    def table(self) -> list[dict[str, object]]:
        """Every measurement so far: product, rows, in, out, and GFLOP/s."""
        return [
            {
                "product": product,
                "rows": rows,
                "in": inp,
                "out": out,
                "gflops": 2 * rows * inp * out / seconds / 1e9,
            }
            for (product, rows, inp, out), seconds in sorted(self.cache.items())
        ]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def roofline(matmuls: Iterable[Matmul], rates: MatmulRates, training: bool) -> tuple[float, float]:
    """Model FLOPs of a batch and the seconds its matmuls take at the measured rates.

    Arguments:
        matmuls: the layer applications of one batch, one per batched step.
        rates: the measured rates.
        training: count the two backward products too (3x the forward FLOPs).

    Returns:
        ``(flops, seconds)``.

    Example:
        >>> rates = MatmulRates(max_rows=8, min_seconds=0.0)
        >>> flops, seconds = roofline([Matmul(4, 8, 8)], rates, training=True)
        >>> flops, seconds > 0
        (1536, True)
    """
    flops, seconds = 0, 0.0
    products: tuple[Product, ...] = (
        ("forward", "grad_input", "grad_weight") if training else ("forward",)
    )
    for mm in matmuls:
        if mm.rows == 0:
            continue
        flops += mm.flops * len(products)
        seconds += sum(rates.seconds(p, mm.rows, mm.inp, mm.out) for p in products)
    return flops, seconds


def flops_fields(
    flops: float, roofline_s: float, measured_s: float, batch: int
) -> dict[str, float]:
    """The JSON fields of a results row about FLOPs (see the module docstring).

    Arguments:
        flops: model FLOPs of one step.
        roofline_s: seconds of its matmuls at the measured rates.
        measured_s: the measured seconds of one step.
        batch: instances per step.

    Returns:
        ``gflop_per_tree``, ``achieved_gflops``, ``matmul_gflops`` and ``flops_fraction``.

    Example:
        >>> flops_fields(4e9, 1.0, 2.0, 4)
        {'gflop_per_tree': 1.0, 'achieved_gflops': 2.0, 'matmul_gflops': 4.0, 'flops_fraction': 0.5}
    """
    return {
        "gflop_per_tree": flops / batch / 1e9,
        "achieved_gflops": flops / measured_s / 1e9,
        "matmul_gflops": flops / roofline_s / 1e9 if roofline_s else 0.0,
        "flops_fraction": roofline_s / measured_s,
    }
