"""The compiled model: modules and state, plans across processes, reuse, deep inputs."""

from __future__ import annotations

import copy
import pickle
import random
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from batchfold.blocks import (
    FC,
    AllOf,
    Embedding,
    ForwardDeclaration,
    FromTensor,
    Function,
    GetItem,
    Identity,
    Map,
    Metric,
    OneOf,
    PyObjectType,
    Record,
    Scalar,
    SequenceBatch,
    Sum,
    TensorType,
    Vector,
    compile,
)
from batchfold.graph import Graph

pytestmark = pytest.mark.usefixtures("float64", "walks")  # every test: generated and closures


def word_model(seed: int = 0) -> tuple[Any, Embedding, FC]:
    torch.manual_seed(seed)
    emb = Embedding(20, 4)
    fc = FC(4, 4, activation=torch.tanh)
    word = Scalar("int64") >> emb >> fc
    block = Map(word >> AllOf(Identity(), Metric("words")) >> GetItem(0)) >> Sum() >> fc
    return block, emb, fc


def sentences(count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(20) for _ in range(rng.randint(0, 6))] for _ in range(count)]


def test_modules_registered_once_and_state_dict_round_trips():
    block, emb, fc = word_model()
    extra = nn.Parameter(torch.ones(4))
    model = compile(AllOf(block, FromTensor(extra), FromTensor(torch.zeros(2))))
    params = list(model.parameters())
    assert len(params) == len({id(p) for p in params}) == 4  # emb, fc weight+bias, extra
    assert {id(p) for p in params} == {id(emb.weight), id(extra), *map(id, fc.parameters())}
    other_block, other_emb, _ = word_model(seed=1)
    other = compile(
        AllOf(other_block, FromTensor(nn.Parameter(torch.zeros(4))), FromTensor(torch.zeros(2)))
    )
    inputs = sentences(5)
    assert not torch.allclose(model(inputs)[0][0], other(inputs)[0][0])
    other.load_state_dict(model.state_dict())
    for a, b in zip(model(inputs)[0], other(inputs)[0], strict=True):
        torch.testing.assert_close(a, b)
    assert model.to("cpu") is model and model.device == torch.device("cpu")


def test_a_block_reused_in_two_places_and_two_models_shares_weights_and_batches():
    block, emb, fc = word_model()
    one = compile(block)
    two = compile(Record((block, block)))
    inputs = sentences(6, seed=2)
    out_one, metrics_one = one(inputs)
    (left, right), metrics_two = two(list(zip(inputs, inputs, strict=True)))
    torch.testing.assert_close(left, out_one)
    torch.testing.assert_close(right, out_one)
    per_input = metrics_one["words"].split([len(x) for x in inputs])
    torch.testing.assert_close(
        metrics_two["words"], torch.cat([t for p in per_input for t in (p, p)])
    )
    stats = two.last_stats
    assert stats is not None and stats.plan is not None
    embeds = [s for s in stats.plan.steps if s.sig.name == "Embedding"]
    assert len(embeds) == 1 and len(embeds[0].nodes) == 2 * sum(map(len, inputs))
    assert {id(p) for p in two.parameters()} == {id(p) for p in one.parameters()}


def test_plan_pickles_and_dataloader_workers_give_the_same_outputs():
    block, _, _ = word_model()
    model = compile(block)
    inputs = sentences(12, seed=3)
    batches = [inputs[i : i + 4] for i in range(0, 12, 4)]
    want = [model(batch) for batch in batches]
    plan = pickle.loads(pickle.dumps(model.schedule(batches[0])))
    torch.testing.assert_close(model.run(plan)[0], want[0][0])
    loader = DataLoader(
        inputs,  # type: ignore[arg-type]
        batch_size=4,
        collate_fn=model.schedule,
        num_workers=2,
        multiprocessing_context="fork",
    )
    for plan, (out, metrics) in zip(loader, want, strict=True):
        got_out, got_metrics = model.run(plan)
        torch.testing.assert_close(got_out, out)
        torch.testing.assert_close(got_metrics["words"], metrics["words"])


def test_a_plan_runs_on_the_weights_of_the_model_that_runs_it():
    block, _, _ = word_model()
    big = nn.Parameter(torch.randn(100_000, dtype=torch.float64))
    model = compile(AllOf(block, FromTensor(big)))
    clone = copy.deepcopy(model)
    with torch.no_grad():
        for p in clone.parameters():
            p.mul_(2)
    inputs = sentences(5, seed=6)
    plan = model.schedule(inputs)
    pickled = pickle.dumps(plan)
    assert len(pickled) < 100_000  # the constant is not in it: the running model supplies it
    for runner in (model, clone):
        want, _ = runner(inputs)
        for candidate in (plan, pickle.loads(pickled)):
            got, _ = runner.run(candidate)
            for a, b in zip(got, want, strict=True):
                torch.testing.assert_close(a, b, rtol=0, atol=0)
    (_, constant), _ = clone.run(pickle.loads(pickled))
    constant.sum().backward()
    assert big.grad is None and clone.tensors[0].grad is not None  # the clone's parameter
    # Weights updated in place between schedule and run (an optimizer step while a
    # DataLoader prepares the next plan) are the ones the plan runs on, constants included.
    plan = model.schedule(inputs)
    pickled = pickle.dumps(plan)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)
    want, _ = model(inputs)
    for candidate in (plan, pickle.loads(pickled)):
        got, _ = model.run(candidate)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    other = compile(Map(Scalar()) >> Sum())
    for candidate in (plan, pickle.loads(pickled)):
        with pytest.raises(ValueError, match="scheduled by a model with other ops"):
            other.run(candidate)


def test_compiled_model_pickles_and_deep_copies():
    block, _, _ = word_model()
    model = compile(block)
    inputs = sentences(4, seed=4)
    want = model(inputs)[0]
    for clone in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        torch.testing.assert_close(clone(inputs)[0], want)
        assert all(p is not q for p, q in zip(clone.parameters(), model.parameters(), strict=True))


def chain_input(depth: int) -> Any:
    x: Any = 1.0
    for i in range(depth):
        x = [x, float(i % 3)]
    return x


def test_a_1000_deep_recursive_input():
    expr = ForwardDeclaration(PyObjectType(), TensorType(()), name="expr")
    node = Map(expr()) >> Sum() >> Function(lambda t: 0.5 * t)
    expr.resolve_to(OneOf(lambda x: isinstance(x, list), {False: Scalar(), True: node}))
    model = compile(expr(), scheduler="depth")
    x = chain_input(1000)
    want = 1.0
    for i in range(1000):
        want = 0.5 * (want + float(i % 3))
    out, _ = model([x, 2.0])
    torch.testing.assert_close(out, torch.tensor([want, 2.0]))
    torch.testing.assert_close(expr().eval(chain_input(1000)), torch.tensor(want))


def test_sequence_outputs_padded_or_concatenated():
    block = Map(Scalar())
    inputs = [[1.0, 2.0], [], [3.0]]
    padded, _ = compile(block)(inputs)
    assert isinstance(padded, SequenceBatch)
    torch.testing.assert_close(padded.values, torch.tensor([[1.0, 2.0], [0.0, 0.0], [3.0, 0.0]]))
    assert padded.lengths.tolist() == [2, 0, 1]
    flat, _ = compile(block, sequences="concat")(inputs)
    torch.testing.assert_close(flat.values, torch.tensor([1.0, 2.0, 3.0]))


def test_metrics_with_no_values_have_their_shape():
    model = compile(Map(Vector(3) >> Metric("v")))
    out, metrics = model([[], []])
    assert out is None and metrics["v"].shape == (0, 3)


def test_recorded_graph_lints():
    block, _, _ = word_model()
    model = compile(block)
    graph = Graph()
    model._record(model._tape(graph), sentences(5))
    graph.lint()
    assert graph.pending > 0
