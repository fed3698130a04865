"""Recursion with no base case is refused before any input is walked; recursion that can end runs."""

from __future__ import annotations

import importlib.util
import random
import re
from pathlib import Path
from typing import Any

import pytest
import torch

import batchfold as bf
from batchfold.blocks import (
    AllOf,
    Block,
    BlockInputError,
    BlockTypeError,
    Broadcast,
    Composition,
    Fold,
    ForwardDeclaration,
    Function,
    GetItem,
    Identity,
    InputTransform,
    Map,
    OneOf,
    Optional,
    PyObjectType,
    Record,
    Reduce,
    Scalar,
    Sum,
    TensorType,
    TupleType,
    Zeros,
    Zip,
    compile,
)

SCALAR = TensorType(())
pair = InputTransform(lambda x: (x, x), name="pair")
add = Function(torch.add)
is_list = lambda x: isinstance(x, list)  # noqa: E731


def declaration(name: str = "expr") -> ForwardDeclaration:
    return ForwardDeclaration(PyObjectType(), SCALAR, name=name)


def endless_bodies() -> dict[str, tuple[ForwardDeclaration, Block, str]]:
    """Declarations with bodies that call them on every path, and the loop the error shows."""
    expr = declaration()
    tagged = ForwardDeclaration(TupleType(SCALAR, PyObjectType()), SCALAR, name="expr")
    return {
        "record": (
            expr,
            pair >> Record((expr(), expr())) >> add,
            "Pipe at expr -> Record at expr[1] -> expr() at expr[1][0]",
        ),
        "every case recurses": (
            expr,
            OneOf(is_list, {False: expr(), True: expr() >> Function(torch.neg)}),
            "OneOf at expr -> expr() at expr.cases[False]",
        ),
        "pre_block recurses": (
            expr,
            OneOf(is_list, {False: Identity(), True: Function(torch.neg)}, pre_block=expr()),
            "OneOf at expr -> expr() at expr.pre_block",
        ),
        "all of": (
            expr,
            AllOf(expr(), Scalar()) >> add,
            "Pipe at expr -> AllOf at expr[0] -> expr() at expr[0][0]",
        ),
        "composition": (
            expr,
            Composition(lambda x: add.reads(expr().reads(x), Scalar().reads(x)), name="node"),
            "Composition at expr -> expr() at expr.nodes[0]",
        ),
        # a Map over a broadcast sequence walks its block once, whatever the input
        "map over a broadcast": (
            tagged,
            AllOf(Broadcast() >> Map(tagged()), GetItem(1)) >> Zip() >> Map(GetItem(0)) >> Sum(),
            "Pipe at expr -> AllOf at expr[0] -> Pipe at expr[0][0] -> Map at expr[0][0][1] "
            "-> expr() at expr[0][0][1].block",
        ),
    }


@pytest.mark.parametrize("case", list(endless_bodies()))
def test_a_declaration_that_recurses_on_every_path_is_refused_when_resolved(case: str):
    expr, body, loop = endless_bodies()[case]
    message = (
        f") at expr needs a base case: every path through expr calls expr() again "
        f"({loop}), so no input can finish. Add a case that does not recurse, e.g. a OneOf case"
    )
    with pytest.raises(BlockTypeError, match=re.escape(message)):
        expr.resolve_to(body)
    assert expr.target is None  # a refused resolve_to leaves it unresolved


def test_compile_refuses_it_too_before_walking_any_input():
    expr, expr.target, _ = endless_bodies()["record"]  # as if resolve_to had not checked it
    runs = (lambda: compile(expr()), lambda: expr().eval(1.0), lambda: compile(AllOf(expr())))
    for run in runs:
        with pytest.raises(BlockTypeError, match=r"at expr needs a base case") as info:
            run()
        assert not isinstance(info.value.__context__, RecursionError)


def test_mutual_recursion_is_refused_when_its_loop_closes():
    even, odd = declaration("even"), declaration("odd")
    even.resolve_to(pair >> Record((odd(), Scalar())) >> add)  # odd is not resolved yet: fine
    message = (
        "name='odd') at odd needs a base case: every path through odd calls odd() again (Pipe "
        "at odd -> Record at odd[0] -> even() at odd[0][0] -> Pipe at even -> Record at even[1] "
        "-> odd() at even[1][0])"
    )
    with pytest.raises(BlockTypeError, match=re.escape(message)):
        odd.resolve_to(Record((even(),)) >> GetItem(0))
    odd.resolve_to(OneOf(is_list, {False: Scalar(), True: GetItem(0) >> even()}))
    assert float(compile(odd()).evaluate([1.0])) == 2.0  # even(1.0) = odd(1.0) + 1.0


def test_a_declaration_that_only_calls_an_endless_one_is_refused_naming_the_loop():
    inner, outer = declaration("inner"), declaration("outer")
    outer.resolve_to(inner() >> Function(torch.neg))  # inner is not resolved yet: fine
    inner.target = pair >> Record((inner(), inner())) >> add  # unchecked, as above
    message = (
        "name='inner') at inner needs a base case: every path through inner calls inner() again "
        "(Pipe at inner -> Record at inner[1] -> inner() at inner[1][0])"
    )
    with pytest.raises(BlockTypeError, match=re.escape(message)):
        compile(outer())


def nested_lists(rng: random.Random, depth: int) -> Any:
    if depth == 0 or rng.random() < 0.3:
        return float(rng.randrange(-3, 4))
    return [nested_lists(rng, depth - 1) for _ in range(rng.randrange(0, 4))]


def count_nodes(x: Any) -> float:
    return 1.0 + sum(count_nodes(item) for item in x) if isinstance(x, list) else 1.0


def sum_leaves(x: Any) -> float:
    return sum(sum_leaves(item) for item in x) if isinstance(x, list) else float(x)


def linked(x: Any) -> Any:
    """A nested list as a linked list of (number of leaves, rest), ending in None."""
    items = x if isinstance(x, list) else [x]
    out = None
    for item in reversed(items):
        out = (sum_leaves(item), out)
    return out


def sum_linked(x: Any) -> float:
    return 0.0 if x is None else x[0] + sum_linked(x[1])


def productive(expr: ForwardDeclaration) -> dict[str, tuple[Block, Any, Any]]:
    """Recursions that can end: body, root block and reference function on nested lists."""
    lists = InputTransform(lambda x: x if isinstance(x, list) else [])
    one = InputTransform(lambda _: 1.0) >> Scalar()
    return {
        "OneOf base case": (
            OneOf(is_list, {False: Scalar(), True: Map(expr()) >> Sum()}),
            expr(),
            sum_leaves,
        ),
        "Map over a possibly empty sequence": (
            lists >> AllOf(one, Map(expr()) >> Sum()) >> add,
            expr(),
            count_nodes,
        ),
        "Fold over the children": (
            lists >> AllOf(one, Map(expr()) >> Fold(add, Zeros(SCALAR))) >> add,
            expr(),
            count_nodes,
        ),
        "Reduce over the children": (
            lists >> AllOf(one, Map(expr()) >> Reduce(add)) >> add,
            expr(),
            count_nodes,
        ),
        "Optional on a linked list": (
            Optional(Record((Scalar(), expr())) >> add),
            InputTransform(linked) >> expr(),
            lambda x: sum_linked(linked(x)),
        ),
    }


@pytest.mark.usefixtures("walks")
@pytest.mark.parametrize("case", list(productive(declaration())))
def test_recursion_that_can_end_compiles_and_runs(case: str):
    expr = declaration()
    body, root, reference = productive(expr)[case]
    expr.resolve_to(body)
    rng = random.Random(0)
    inputs = [nested_lists(rng, 5) for _ in range(12)] + [[], 2.0, [[[]]]]
    out, _ = compile(root)(inputs)
    want = torch.tensor([float(reference(x)) for x in inputs])
    torch.testing.assert_close(out, want)


def test_the_tree_lstm_and_calculator_models_compile_and_run():
    from batchfold.data.trees import random_trees
    from batchfold.models.tree_lstm import TreeLSTMClassifier, tree_node_losses
    from batchfold.models.tree_lstm_blocks import tree_lstm_blocks

    torch.manual_seed(0)
    model = TreeLSTMClassifier(20, emb_dim=4, hidden=3, n_classes=5)
    trees = random_trees(4, 1, 6, rng=2, vocab_size=20)
    _, metrics = compile(tree_lstm_blocks(model))(trees)
    leaf = bf.function(model.cell.leaf, batched=True)
    node = bf.function(model.cell, batched=True)
    losses = bf.batch_map(lambda t: tree_node_losses(model, t, leaf, node), trees)
    want = torch.stack([loss for tree in losses for loss in tree]).sum()
    torch.testing.assert_close(metrics["loss"].sum(), want)

    path = Path(__file__).parents[2] / "examples" / "calculator.py"
    spec = importlib.util.spec_from_file_location("calculator_example", path)
    assert spec is not None and spec.loader is not None
    calculator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(calculator)
    rng = random.Random(0)
    logits, _ = calculator.build_model()([calculator.random_expression(rng, 3) for _ in range(5)])
    assert logits.shape == (5, 3) and bool(torch.isfinite(logits).all())


def test_an_input_that_contains_itself_fails_with_a_clear_error():
    expr = declaration()
    expr.resolve_to(OneOf(is_list, {False: Scalar(), True: Map(expr()) >> Sum()}))
    model = compile(expr())
    cycle: list[Any] = [1.0]
    cycle.append(cycle)
    with pytest.raises(
        BlockInputError, match=r"input 1 is too deep to record: expr was [\d,]+ calls"
    ) as info:
        model([[2.0], cycle])
    assert info.value.__suppress_context__  # not the recursion's traceback, as deep as the input
    assert model([[2.0], [[3.0]]])[0].tolist() == [2.0, 3.0]  # deep but finite inputs still run


def test_a_recursion_error_outside_declarations_stays_one():
    def endless(x: Any) -> Any:
        return endless(x)

    with pytest.raises(RecursionError):
        compile(InputTransform(endless) >> Scalar())([1.0])
