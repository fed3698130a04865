"""Input, tensor and composition blocks against a plain Python reference per input."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from blocks_oracle import assert_block_matches
from torch import nn

from batchfold.blocks import (
    FC,
    AllOf,
    Composition,
    Concat,
    Embedding,
    FromTensor,
    Function,
    GetItem,
    InputTransform,
    Map,
    Metric,
    OneHot,
    OneHotFromList,
    Optional,
    Record,
    Scalar,
    Slice,
    Tensor,
    TensorType,
    TupleType,
    Vector,
    Void,
    Zeros,
    compile,
)
from batchfold.schedule import Scheduler

pytestmark = pytest.mark.usefixtures("float64", "walks")  # every test: generated and closures
SCHEDULERS = ["agenda", "depth"]


def test_scalar_vector_tensor_from_numbers_lists_arrays_and_tensors():
    inputs = [
        ([1.5, -2.0], 3, [[1, 2], [3, 4]]),
        (np.array([0.5, 0.25]), 7, np.array([[5, 6], [7, 8]])),
        (torch.tensor([4.0, 5.0]), -1, torch.tensor([[0, 1], [1, 0]])),
    ]
    block = Record((Vector(2), Scalar("int64"), Tensor([2, 2], torch.int64)))

    def reference(x: Any) -> Any:
        v, s, t = x
        return (
            torch.as_tensor(v, dtype=torch.float64),
            torch.tensor(s),
            torch.as_tensor(t, dtype=torch.int64),
        )

    assert_block_matches(block, inputs, reference)


def test_input_transform_getitem_and_slice():
    block = AllOf(
        InputTransform(len) >> Scalar(),
        GetItem("xs") >> Slice(start=1) >> Map(Scalar()),
        GetItem("xs") >> GetItem(-1) >> Scalar(),
    )
    inputs = [{"xs": [1.0, 2.0, 3.0]}, {"xs": [4.0, 5.0]}, {"xs": [6.0]}]

    def reference(x: Any) -> Any:
        return (
            torch.tensor(float(len(x))),
            [torch.tensor(v) for v in x["xs"][1:]],
            torch.tensor(x["xs"][-1]),
        )

    assert_block_matches(block, inputs, reference)


def test_one_hot_blocks():
    block = AllOf(GetItem(0) >> OneHot(2, 6), GetItem(1) >> OneHotFromList("abc", strict=False))
    inputs = [(2, "a"), (5, "c"), (3, "z"), (2, "b")]

    def reference(x: Any) -> Any:
        letter = "abc".index(x[1]) if x[1] in "abc" else None
        second = torch.zeros(3) if letter is None else F.one_hot(torch.tensor(letter), 3).double()
        return (F.one_hot(torch.tensor(x[0] - 2), 4).double(), second)

    assert_block_matches(block, inputs, reference)


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_function_on_tuples_with_tuple_output(scheduler: Scheduler):
    torch.manual_seed(0)
    lin = nn.Linear(3, 2)

    def split(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = lin(torch.cat([a, b], dim=-1))
        return y.tanh(), (y * b[..., :2]).sum(-1)

    block = Record((Vector(2), Vector(1))) >> Function(split, modules=[lin])

    def reference(x: Any) -> Any:
        a, b = torch.tensor(x[0]), torch.tensor(x[1])
        y = lin(torch.cat([a, b]))
        return (y.tanh(), (y * b[:2]).sum())

    inputs = [([random.random(), 1.0], [random.random()]) for _ in range(5)]
    assert_block_matches(block, inputs, reference, list(lin.parameters()), scheduler)


def test_fc_and_embedding_layers_share_weights_where_reused():
    torch.manual_seed(1)
    emb = Embedding(10, 4, initializer=torch.randn(10, 4))
    fc = FC(4, 4, activation=torch.tanh)
    word = Scalar("int64") >> emb >> fc >> fc  # one layer used twice
    block = Map(word)

    def reference(x: Any) -> Any:
        return [fc(fc(emb.weight[w % 10])) for w in x]

    inputs = [[1, 2, 3], [], [9, 13]]
    assert_block_matches(block, inputs, reference, [emb.weight, *fc.parameters()])


def test_from_tensor_zeros_and_concat():
    torch.manual_seed(2)
    weight = nn.Parameter(torch.randn(3))
    block = (
        AllOf(Vector(3) >> Function(torch.sin), FromTensor(weight), Zeros(TensorType((2,))))
        >> Concat()
    )

    def reference(x: Any) -> Any:
        return torch.cat([torch.tensor(x).sin(), weight, torch.zeros(2)])

    inputs = [[1.0, 2.0, 3.0], [0.0, 0.5, 1.0]]
    assert_block_matches(block, inputs, reference, [weight])


def test_concat_nested_tuples_and_dims():
    with pytest.raises(TypeError, match="shapes differ only in dim 0"):
        _ = Record((Tensor([2, 2]), Tensor([3, 3]))) >> Concat()
    along = Record((Tensor([2, 2]), Tensor([2, 1]))) >> Concat(dim=1)

    def reference(x: Any) -> Any:
        return torch.cat([torch.tensor(x[0][0]), torch.tensor([x[0][1]]), torch.tensor(x[1])])

    assert_block_matches(
        Record(((Vector(2), Scalar()), Vector(2))) >> Concat(flatten=True),
        [(([1.0, 2.0], 3.0), [4.0, 5.0])],
        reference,
    )
    x = ([[1.0, 2.0], [3.0, 4.0]], [[5.0], [6.0]])
    torch.testing.assert_close(along.eval(x), torch.tensor([[1.0, 2.0, 5.0], [3.0, 4.0, 6.0]]))
    assert along.output_type() == TensorType((2, 3))


def test_optional_and_void():
    torch.manual_seed(3)
    fc = FC(2, 3)
    block = Optional(Vector(2) >> fc)
    inputs = [[1.0, 2.0], None, [0.5, -1.0]]

    def reference(x: Any) -> Any:
        return torch.zeros(3) if x is None else fc(torch.tensor(x))

    assert_block_matches(block, inputs, reference, list(fc.parameters()))
    assert Void().eval(5) is None
    custom = Optional(Vector(2), FromTensor(torch.ones(2)))
    torch.testing.assert_close(custom.eval(None), torch.ones(2))


def test_composition_reuses_a_wire_and_sends_metrics():
    torch.manual_seed(4)
    fc = FC(2, 2, activation=torch.tanh)

    def wiring(x: Any) -> Any:
        v = Vector(2).reads(x["v"])
        h = fc.reads(v)
        both = Concat().reads(h, v)
        Metric("h").reads(h, x["name"])
        return both, h

    block = Composition(wiring)
    inputs = [{"v": [1.0, 2.0], "name": "a"}, {"v": [0.0, -1.0], "name": "b"}]

    def reference(x: Any) -> Any:
        v = torch.tensor(x["v"])
        h = fc(v)
        return (torch.cat([h, v]), h)

    metrics = assert_block_matches(block, inputs, reference, list(fc.parameters()))
    torch.testing.assert_close(metrics["h"], torch.stack([reference(x)[1] for x in inputs]))
    plan = compile(block).schedule(inputs)
    assert plan.labels["h"] == ["a", "b"] and plan.metric_instances["h"].tolist() == [0, 1]


def test_record_from_dict_keeps_insertion_order_and_checks_fields():
    block = Record({"b": Scalar(), "a": Scalar("int64")})
    assert block.output_type() == TupleType(TensorType(()), TensorType((), torch.int64))
    assert_block_matches(
        block,
        [{"a": 1, "b": 2.0}, {"a": 3, "b": 4.0}],
        lambda x: (torch.tensor(x["b"]), torch.tensor(x["a"])),
    )
