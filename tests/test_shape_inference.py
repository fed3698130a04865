"""Output shapes known without meta kernels: the same as running the op, and no compiler import."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from batchfold.graph import Slot, TensorMeta
from batchfold.lazy.known_shapes import known_shape


def _meta(t: torch.Tensor) -> TensorMeta:
    return TensorMeta.of(tuple(t.shape), t.dtype, t.device)


@pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN")
@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn_tanh"])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("batch_first", [False, True])
def test_recurrent_layers_shapes_are_the_ops(
    kind: str, layers: int, bidirectional: bool, batch_first: bool
) -> None:
    proj = 2 if kind == "lstm" and layers == 2 else 0
    module = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn_tanh": nn.RNN}[kind]
    options = {"proj_size": proj} if proj else {}
    layer = module(3, 4, layers, bidirectional=bidirectional, batch_first=batch_first, **options)
    x = torch.randn((2, 5, 3) if batch_first else (5, 2, 3))
    directions = 2 if bidirectional else 1
    h0 = torch.zeros(directions * layers, 2, proj or 4)
    states = (h0, torch.zeros(directions * layers, 2, 4)) if kind == "lstm" else (h0,)
    hx = tuple(Slot(i + 1) for i in range(len(states)))
    targs = (Slot(0), hx if kind == "lstm" else hx[0], layer._flat_weights, True, layers)
    targs += (0.0, False, bidirectional, batch_first)
    got = known_shape(getattr(torch, kind), targs, {}, tuple(map(_meta, (x, *states))))
    want = getattr(torch, kind)(x, states if kind == "lstm" else h0, *targs[2:])
    assert [(tuple(g.shape), g.dtype) for g in got] == [(tuple(w.shape), w.dtype) for w in want]
    wrong = (Slot(0), *targs[1:])  # an input of another size: left to the meta kernel
    assert (
        known_shape(getattr(torch, kind), wrong, {}, (_meta(x[..., :2]), *map(_meta, states)))
        is None
    )


@pytest.mark.parametrize(
    ("a", "b"),
    [((3,), (3,)), ((2, 3), (3,)), ((3,), (3, 4)), ((2, 3), (3, 4)), ((5, 2, 3), (3, 4))],
)
def test_matmul_shapes_are_the_ops(a: tuple[int, ...], b: tuple[int, ...]) -> None:
    x, w = torch.randn(a), torch.randn(b)
    got = known_shape(torch.matmul, (Slot(0), w), {}, (_meta(x),))
    assert got.shape == (x @ w).shape and got.dtype == x.dtype
    got = known_shape(torch.Tensor.__matmul__, (Slot(0), Slot(1)), {}, (_meta(x), _meta(w)))
    assert got.shape == (x @ w).shape
    assert known_shape(torch.matmul, (Slot(0), w.double()), {}, (_meta(x),)) is None
    flags = x > 0  # bool: no matmul kernel, left to the meta run to refuse
    assert known_shape(torch.matmul, (Slot(0), w > 0), {}, (_meta(flags),)) is None
    assert known_shape(torch.matmul, (Slot(0), torch.randn(7)), {}, (_meta(x),)) is None


def test_a_first_batch_map_imports_no_compiler() -> None:
    """The usual first call (linear, dropout, an LSTM, ``x @ W`` by a large ``W``, a loss over
    rows) needs no meta kernels, whose first use imports ``torch._dynamo`` or sympy (seconds on
    a busy machine)."""
    code = (
        "import sys, torch\n"
        "import batchfold as bf\n"
        "lin, drop = torch.nn.Linear(3, 4), torch.nn.Dropout(0.5)\n"
        "emb, lstm = torch.nn.Embedding(5, 3), torch.nn.LSTM(4, 300, bidirectional=True)\n"
        "w = torch.randn(600, 300)\n"
        "def f(x):\n"
        "    h = drop(torch.tanh(lin(torch.as_tensor(x) + emb(torch.tensor(1)))))\n"
        "    s = (lstm(torch.nn.functional.dropout(h, 0.2))[0] @ w)[:, :3]\n"
        "    return torch.nn.functional.cross_entropy(s, torch.tensor([0] * len(x))).relu()\n"
        "out = bf.batch_map(f, [torch.randn(n, 3) for n in (1, 2, 3, 2)])\n"
        "assert [tuple(o.shape) for o in out] == [()] * 4\n"
        "print(sorted({'torch._dynamo', 'sympy'} & set(sys.modules)))\n"
    )
    src = Path(__file__).parents[1] / "src"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
