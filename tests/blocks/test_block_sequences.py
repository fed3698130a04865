"""Sequence and recursion blocks against a plain Python reference per input."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from blocks_oracle import assert_block_matches
from torch import nn

from batchfold.blocks import (
    FC,
    RNN,
    AllOf,
    BlockInputError,
    Broadcast,
    Concat,
    Embedding,
    Fold,
    ForwardDeclaration,
    Function,
    GetItem,
    Identity,
    Length,
    Map,
    Max,
    Mean,
    Metric,
    Min,
    NGrams,
    Nth,
    OneOf,
    Pad,
    PyObjectType,
    Record,
    Reduce,
    Scalar,
    Sum,
    TensorType,
    TupleType,
    Vector,
    Zeros,
    Zip,
    ZipWith,
    compile,
)
from batchfold.schedule import Scheduler

pytestmark = pytest.mark.usefixtures("float64", "walks")  # every test: generated and closures
SCHEDULERS = ["agenda", "depth"]


def random_lists(count: int, max_len: int, seed: int = 0, dim: int = 3) -> list[list[list[float]]]:
    rng = random.Random(seed)
    return [
        [[rng.uniform(-1, 1) for _ in range(dim)] for _ in range(rng.randint(0, max_len))]
        for _ in range(count)
    ]


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_map_sum_min_max_mean(scheduler: Scheduler):
    torch.manual_seed(0)
    fc = FC(3, 3, activation=torch.tanh)
    items = Map(Vector(3) >> fc)
    block = AllOf(items >> Sum(), items >> Min(), items >> Max(), items >> Mean(), items)

    def reference(x: Any) -> Any:
        hs = [fc(torch.tensor(v)) for v in x]
        if not hs:
            zero = torch.zeros(3)
            return (zero, zero, zero, zero, [])
        stacked = torch.stack(hs)
        return (
            stacked.sum(0),
            stacked.min(0).values,
            stacked.max(0).values,
            stacked.mean(0),
            hs,
        )

    inputs = random_lists(7, 6, seed=1)
    assert_block_matches(block, inputs, reference, list(fc.parameters()), scheduler, rtol=1e-9)


def test_reduce_is_a_balanced_tree_and_fold_is_left_to_right():
    weight = nn.Parameter(torch.tensor([1.5, 0.5]))

    def pair(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.stack([a[..., 0] + 2 * b[..., 0], a[..., 1] * b[..., 1]], dim=-1) * weight

    combine = Function(pair)
    v2 = TensorType((2,))
    reduced = Map(Vector(2)) >> Reduce(combine)
    folded = Map(Vector(2)) >> Fold(combine, Zeros(v2) >> Function(lambda z: z + 1))

    def balanced(x: Any) -> Any:
        items = [torch.tensor(v) for v in x]
        if not items:
            return torch.zeros(2)
        while len(items) > 1:
            nxt = [pair(items[i], items[i + 1]) for i in range(0, len(items) - 1, 2)]
            items = nxt + ([items[-1]] if len(items) % 2 else [])
        return items[0]

    def left(x: Any) -> Any:
        acc = torch.ones(2)
        for v in x:
            acc = pair(acc, torch.tensor(v))
        return acc

    inputs = random_lists(6, 9, seed=2, dim=2)
    assert_block_matches(reduced, inputs, balanced, [weight])
    assert_block_matches(folded, inputs, left, [weight])
    eight = [[[1.0, 1.0]] * 8]
    deep_reduce = compile(reduced, scheduler="depth")
    deep_reduce(eight)
    deep_fold = compile(folded, scheduler="depth")
    deep_fold(eight)
    assert deep_reduce.last_stats is not None and deep_fold.last_stats is not None
    # 8 items: Reduce is 3 levels of combine, Fold 8; plus the input (and start) steps
    assert deep_reduce.last_stats.steps == 1 + 3
    assert deep_fold.last_stats.steps == 1 + 2 + 8


def test_rnn_with_default_and_given_initial_state():
    torch.manual_seed(3)
    cell = nn.GRUCell(2, 4)
    t2, t4 = TensorType((2,)), TensorType((4,))

    def step(x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = cell(x, h)
        return h.sum(-1), h

    block = Map(Vector(2)) >> RNN(Function(step, in_type=TupleType(t2, t4), modules=[cell]))

    def reference(x: Any) -> Any:
        h = torch.zeros(4)
        ys = []
        for v in x:
            h = cell(torch.tensor(v).unsqueeze(0), h.unsqueeze(0)).squeeze(0)
            ys.append(h.sum())
        return (ys, h)

    inputs = random_lists(5, 5, seed=3, dim=2)
    assert_block_matches(block, inputs, reference, list(cell.parameters()), rtol=1e-9)
    from_input = Record((Map(Vector(2)), Vector(4))) >> RNN(
        Function(step, modules=[cell]), initial_state_from_input=True
    )
    x = ([[1.0, 2.0], [3.0, 4.0]], [0.1, 0.2, 0.3, 0.4])
    ys, h = from_input.eval(x)
    want_h = torch.tensor(x[1])
    for v in x[0]:
        want_h = cell(torch.tensor(v).unsqueeze(0), want_h.unsqueeze(0)).squeeze(0)
    torch.testing.assert_close(h, want_h)
    assert len(ys) == 2


def test_broadcast_zip_zipwith_ngrams_nth_length():
    scale = Record((Map(Vector(2)), Vector(2) >> Broadcast())) >> ZipWith(Function(torch.mul))
    inputs = [([[1.0, 2.0], [3.0, 4.0]], [10.0, 100.0]), ([], [1.0, 1.0])]

    def reference(x: Any) -> Any:
        return [torch.tensor(v) * torch.tensor(x[1]) for v in x[0]]

    assert_block_matches(scale, inputs, reference)
    grams = Map(Scalar()) >> NGrams(2) >> Map(Function(torch.sub))
    assert_block_matches(
        grams,
        [[1.0, 4.0, 9.0], [2.0]],
        lambda x: [torch.tensor(a - b) for a, b in zip(x, x[1:], strict=False)],
    )
    picks = AllOf(Nth() >> Scalar(), GetItem(0) >> Length("int64"), GetItem(0) >> Length())
    assert_block_matches(
        picks,
        [([5.0, 6.0, 7.0], 2), ([8.0], 0)],
        lambda x: (
            torch.tensor(x[0][x[1]]),
            torch.tensor(len(x[0])),
            torch.tensor(float(len(x[0]))),
        ),
    )
    assert Zip().eval(([1, 2], "abc")) == [(1, "a"), (2, "b")]


def test_nested_sequences_characters_in_words_in_sentences():
    torch.manual_seed(4)
    emb = Embedding(128, 3)
    word = Map(Scalar("int64") >> emb) >> Sum()
    sentence = Map(InputAsCodes() >> word) >> Mean()

    def reference(x: Any) -> Any:
        words = [emb.weight[[ord(c) for c in w]].sum(0) if w else torch.zeros(3) for w in x]
        return torch.stack(words).mean(0) if words else torch.zeros(3)

    inputs = [["ab", "c"], [], ["", "hello", "xyz"]]
    assert_block_matches(sentence, inputs, reference, [emb.weight])


def InputAsCodes() -> Any:  # noqa: N802  (reads like a block in the model above)
    from batchfold.blocks import InputTransform

    return InputTransform(lambda w: [ord(c) for c in w], name="codes")


def tree_sum_block(with_metric: bool) -> tuple[Any, ForwardDeclaration]:
    """Nested lists of numbers -> tanh(sum) at every list, recursively; leaves are numbers."""
    scalar = TensorType(())
    expr = ForwardDeclaration(PyObjectType(), scalar, name="expr")
    leaf = Scalar()
    node = Map(expr()) >> Sum() >> Function(torch.tanh)
    if with_metric:
        node = node >> AllOf(Identity(), Metric("nodes")) >> GetItem(0)
    expr.resolve_to(OneOf(lambda x: isinstance(x, list), {False: leaf, True: node}))
    return expr(), expr


def tree_sum(x: Any, seen: list[torch.Tensor]) -> torch.Tensor:
    if not isinstance(x, list):
        return torch.tensor(float(x))
    total = torch.zeros(())
    for item in x:
        total = total + tree_sum(item, seen)
    value = torch.tanh(total)
    seen.append(value)
    return value


def test_forward_declaration_recursion_with_metrics_inside():
    block, _ = tree_sum_block(with_metric=True)
    inputs = [[1.0, [2.0, [3.0, 0.5]], []], 4.0, [[[-1.0]]]]
    metrics = assert_block_matches(block, inputs, lambda x: tree_sum(x, []))
    seen: list[torch.Tensor] = []
    for x in inputs:
        tree_sum(x, seen)
    assert sorted(metrics["nodes"].tolist()) == sorted(t.item() for t in seen)
    plan = compile(block).schedule(inputs)
    assert sorted(plan.metric_instances["nodes"].tolist()) == [0, 0, 0, 0, 2, 2, 2]


def test_pad_makes_one_tensor_of_a_sequence():
    torch.manual_seed(6)
    fc = FC(3, 2)
    block = AllOf(Map(Vector(3) >> fc) >> Pad(4), Length("int64"))

    def reference(x: Any) -> Any:
        rows = [fc(torch.tensor(v)) for v in x] + [torch.zeros(2)] * (4 - len(x))
        return (torch.stack(rows), torch.tensor(len(x)))

    assert_block_matches(block, random_lists(5, 4, seed=6), reference, list(fc.parameters()))
    with pytest.raises(BlockInputError, match=r"Pad\(4\) at model\[0\]\[1\]: got 5 items"):
        compile(block)([[[0.0] * 3] * 5])


def test_concat_of_mapped_and_reduced():
    torch.manual_seed(5)
    fc = FC(3, 2)
    block = AllOf(Map(Vector(3)) >> Sum(), Map(Vector(3) >> fc) >> Max()) >> Concat()

    def reference(x: Any) -> Any:
        if not x:
            return torch.zeros(5)
        vs = torch.tensor(x)
        return torch.cat([vs.sum(0), torch.stack([fc(v) for v in vs]).max(0).values])

    assert_block_matches(block, random_lists(4, 4, seed=5), reference, list(fc.parameters()))
