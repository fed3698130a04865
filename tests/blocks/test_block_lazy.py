"""Blocks and per-instance lazy code mix: each front end can call the other."""

from __future__ import annotations

import pickle
import random
from typing import Any

import pytest
import torch
from blocks_oracle import assert_block_matches
from torch import nn

import batchfold as bf
from batchfold.blocks import (
    FC,
    BlockInputError,
    Function,
    Map,
    Sum,
    Vector,
    compile,
)
from reference import assert_matches_eager

pytestmark = pytest.mark.usefixtures("float64", "walks")  # every test: generated and closures


def instances(count: int, seed: int = 0) -> list[tuple[list[list[float]], list[float]]]:
    rng = random.Random(seed)
    return [
        (
            [[rng.uniform(-1, 1) for _ in range(3)] for _ in range(rng.randint(1, 4))],
            [rng.uniform(-1, 1) for _ in range(3)],
        )
        for _ in range(count)
    ]


def test_lazy_code_calls_compiled_blocks_on_python_and_lazy_inputs():
    torch.manual_seed(0)
    fc = FC(3, 3, activation=torch.tanh)
    head = FC(3, 2, activation=None)
    lin = nn.Linear(3, 3)
    encoder = compile(Map(Vector(3) >> fc) >> Sum())
    classify = compile(head)  # its input is a tensor: a lazy value inside batch_map

    def per_instance(x: Any) -> Any:
        words, v = x
        summary = encoder.evaluate(words)
        z = torch.relu(lin(torch.tensor(v))) + summary
        return classify.evaluate(z).softmax(-1)

    stats = assert_matches_eager(per_instance, instances(6), nn.ModuleList([fc, head, lin]))
    assert stats.plan is not None
    # every instance's word vectors, then every instance's head, ran as one step each
    names = [step.sig.name for step in stats.plan.steps]
    assert names.count("FC") == 2


def test_a_function_wraps_per_instance_lazy_code():
    torch.manual_seed(1)
    lin = nn.Linear(2, 2)

    def code(h: torch.Tensor) -> torch.Tensor:  # one instance: no batch dimension
        y = torch.tanh(lin(h)) * h.sum()
        return y + torch.tensor([1.0, -1.0])

    block = Map(Vector(2) >> Function(code, per_instance=True, modules=[lin])) >> Sum()
    rng = random.Random(2)
    inputs = [[[rng.random(), rng.random()] for _ in range(n)] for n in (1, 3, 2)]

    def reference(x: Any) -> Any:
        return sum((code(torch.tensor(v)) for v in x), torch.zeros(2))

    assert_block_matches(block, inputs, reference, list(lin.parameters()))
    model = compile(block)
    with pytest.raises(TypeError, match="runs only in the process that scheduled it"):
        pickle.dumps(model.schedule(inputs))


def test_per_instance_code_may_not_read_values():
    def reads(h: torch.Tensor) -> torch.Tensor:
        return h * 2 if h.sum().item() > 0 else h

    model = compile(Vector(2) >> Function(reads, per_instance=True))
    with pytest.raises(BlockInputError, match=r"item\(\) of a lazy value inside Function"):
        model([[1.0, 2.0]])


def test_blocks_with_per_instance_code_inside_batch_map():
    torch.manual_seed(3)
    lin = nn.Linear(3, 3)
    step = Function(lambda h: torch.sigmoid(lin(h)) * h, per_instance=True, modules=[lin])
    encoder = compile(Map(Vector(3) >> step) >> Sum())

    def per_instance(x: Any) -> Any:
        return encoder.evaluate(x[0]) * torch.tensor(x[1]).sum()

    assert_matches_eager(per_instance, instances(4, seed=3), lin)
    assert bf.last_stats() is not None
