"""Generated walk functions record exactly what the walkers' closures record."""

from __future__ import annotations

import linecache
import re
import traceback
from typing import Any

import pytest
import torch

import batchfold.blocks.compiler as compiler
from batchfold.blocks import BlockInputError, Function, OneOf, Scalar, compile
from batchfold.data.trees import BinaryTree, random_trees
from batchfold.graph import Graph
from batchfold.models.tree_lstm import TreeLSTMClassifier
from batchfold.models.tree_lstm_blocks import tree_lstm_blocks


def recorded(model: Any, inputs: list[Any]) -> tuple[str, dict[str, list[Any]]]:
    graph = Graph()
    tape = model._tape(graph)
    model._record(tape, inputs)
    return str(graph), {"metrics": list(tape.metrics.items()), "labels": list(tape.labels.items())}


def test_generated_and_closure_walks_record_the_same_graph(monkeypatch: pytest.MonkeyPatch):
    classifier = TreeLSTMClassifier(30, emb_dim=4, hidden=3)
    trees = random_trees(20, 1, 12, rng=3, vocab_size=30)
    generated = compile(tree_lstm_blocks(classifier))
    assert generated._walk.__code__.co_filename.startswith("<batchfold walk")
    monkeypatch.setattr(compiler, "generate", lambda walker, name: walker.walk)
    closures = compile(tree_lstm_blocks(classifier))
    assert not closures._walk.__code__.co_filename.startswith("<batchfold walk")
    assert recorded(generated, trees) == recorded(closures, trees)


def test_errors_in_generated_code_name_the_block_and_show_the_line():
    model = compile(tree_lstm_blocks(TreeLSTMClassifier(30, emb_dim=4, hidden=3)))
    bad = BinaryTree.node(BinaryTree.leaf(1), BinaryTree.leaf("seven"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs word_id") as info:
        model([BinaryTree.leaf(2), bad])
    frames = traceback.extract_tb(info.value.__traceback__)
    generated = [f for f in frames if f.filename.startswith("<batchfold walk")]
    assert generated and all(f.line for f in generated)  # the generated source shows
    parity = compile(OneOf(lambda x: x % 3, {0: Scalar(), 1: Scalar() >> Function(torch.neg)}))
    assert parity([3.0, 4.0])[0].tolist() == [3.0, -4.0]
    with pytest.raises(BlockInputError, match=r"OneOf.* key 2.0 has no case .*\(input 1\)"):
        parity([3.0, 5.0])


def test_a_walker_past_the_line_limit_is_called_not_inlined(monkeypatch: pytest.MonkeyPatch):
    classifier = TreeLSTMClassifier(30, emb_dim=4, hidden=3)
    trees = random_trees(6, 1, 8, rng=4, vocab_size=30)
    calls = re.compile(r"= w\d+\(tape, ")  # a walker called, not inlined

    def called(model: Any) -> int:
        tree_walk = model._walk.__globals__["c0"].walk  # the ForwardDeclaration's function
        return len(calls.findall("".join(linecache.getlines(tree_walk.__code__.co_filename))))

    inlined = compile(tree_lstm_blocks(classifier))
    monkeypatch.setattr("batchfold.blocks.codegen.MAX_LINES", 5)
    limited = compile(tree_lstm_blocks(classifier))
    assert called(limited) > called(inlined)
    assert recorded(limited, trees) == recorded(inlined, trees)
