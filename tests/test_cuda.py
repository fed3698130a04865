"""On a CUDA device, batched results equal eager one-instance-at-a-time results (float64).

Values and parameter gradients, for ``batch_map`` (recursive trees, both schedulers; a greedy
decoder with sync points), compiled blocks and the Tree-LSTM classifier. The whole module is
skipped where CUDA is not available.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from torch import nn

if not torch.cuda.is_available():
    pytest.skip("CUDA is not available: these tests need a GPU", allow_module_level=True)

import batchfold as bf
from batchfold.blocks import Embedding, Function, Map, Reduce, Scalar, compile
from batchfold.data.trees import random_trees
from batchfold.models.tree_lstm import TreeLSTMClassifier, per_tree_loss, tree_node_losses
from batchfold.models.tree_lstm_blocks import tree_lstm_blocks
from batchfold.schedule import Scheduler
from reference import assert_matches_eager, flat_tensors, loss_of

DEV = torch.device("cuda", 0)  # what parameters moved with .to("cuda") report
SCHEDULERS = ["agenda", "depth"]
pytestmark = pytest.mark.usefixtures("float64")


@pytest.fixture(autouse=True)
def _deterministic_cublas(monkeypatch: pytest.MonkeyPatch) -> None:  # conftest's determinism
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def random_tree(rng: random.Random, leaves: int, vocab: int = 20) -> Any:  # nested tuples
    if leaves == 1:
        return rng.randrange(vocab)
    split = rng.randint(1, leaves - 1)
    return (random_tree(rng, split, vocab), random_tree(rng, leaves - split, vocab))


class TreeNet(nn.Module):
    """A Tree-LSTM-ish recursive encoder for one tree; every tensor it makes is on ``device``."""

    def __init__(self, device: Any = DEV, vocab: int = 20, dim: int = 6, hidden: int = 5) -> None:
        super().__init__()
        self.device = device
        self.embed = nn.Embedding(vocab, dim)
        self.leaf = nn.Linear(dim, 2 * hidden)
        self.node = nn.Linear(2 * hidden, 4 * hidden)

    def forward(self, tree: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(tree, int):
            x = self.embed(torch.tensor(tree, device=self.device))
            i, u = self.leaf(x).chunk(2)
            return torch.sigmoid(i) * torch.tanh(u), torch.zeros(i.shape, device=self.device)
        (hl, cl), (hr, cr) = self(tree[0]), self(tree[1])
        i, f, o, u = self.node(torch.cat([hl, hr])).chunk(4)
        c = i.sigmoid() * u.tanh() + f.sigmoid() * (cl + cr) / 2
        return torch.sigmoid(o) * torch.tanh(c), c


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_recursive_trees_match_eager(scheduler: Scheduler) -> None:
    rng = random.Random(3)
    model = TreeNet().to(DEV)
    trees = [random_tree(rng, rng.randint(1, 12)) for _ in range(10)]
    stats = assert_matches_eager(model, trees, model, scheduler)
    assert stats.mean_batch > 1 and not stats.fallbacks


class Decoder(nn.Module):
    """A greedy GRU decoder that stops at token 0 or after ``limit`` steps (tests/test_sync.py)."""

    def __init__(self, vocab: int = 5, hidden: int = 6) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.cell = nn.GRUCell(hidden, hidden)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, start: tuple[int, int]) -> tuple[list[int], torch.Tensor]:
        token, limit = start
        h = torch.zeros(self.cell.hidden_size, device=DEV) + token * 0.1
        tokens: list[int] = []
        score = torch.zeros((), device=DEV)
        while len(tokens) < limit:
            h = self.cell(self.embed(torch.tensor(token, device=DEV)), h)
            logp = torch.log_softmax(self.out(h), -1)
            token = int(logp.argmax())  # a sync point: the batch runs, every instance resumes
            score = score + logp[token]
            tokens.append(token)
            if token == 0:
                break
        return tokens, score


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_greedy_decoder_with_sync_points_matches_eager(scheduler: Scheduler) -> None:
    model = Decoder().to(DEV)
    rng = random.Random(1)
    starts = [(rng.randrange(1, 5), rng.randrange(1, 12)) for _ in range(24)]
    eager = [model(s) for s in starts]
    batched, stats = bf.batch_map(model, starts, scheduler=scheduler, return_stats=True)
    assert [tokens for tokens, _ in batched] == [tokens for tokens, _ in eager]
    assert stats.syncs == max(len(tokens) for tokens, _ in eager) > 1
    params = list(model.parameters())
    got = [*flat_tensors(batched), *torch.autograd.grad(loss_of(batched), params)]
    want = [*flat_tensors(eager), *torch.autograd.grad(loss_of(eager), params)]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_compiled_blocks_match_eager(scheduler: Scheduler) -> None:
    emb, cell = Embedding(20, 4), nn.Linear(8, 4)

    def combine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:  # batched or one instance
        return torch.tanh(cell(torch.cat([a, b], -1)))

    block = Map(Scalar("int64") >> emb) >> Reduce(Function(combine, modules=[cell]))
    model = compile(block, scheduler=scheduler).to(DEV)  # moves emb and cell too

    def reference(ids: list[int]) -> torch.Tensor:  # pairwise rounds, as Reduce's balanced tree
        items = [emb.weight[i % 20] for i in ids]
        while len(items) > 1:
            paired = [combine(items[i], items[i + 1]) for i in range(0, len(items) - 1, 2)]
            items = paired + items[len(items) - len(items) % 2 :]
        return items[0] if items else torch.zeros(4, device=DEV)

    rng = random.Random(2)
    sentences = [[rng.randrange(40) for _ in range(rng.randint(0, 9))] for _ in range(16)]
    outputs, _ = model(sentences)
    want = torch.stack([reference(s) for s in sentences])
    torch.testing.assert_close(outputs, want, rtol=1e-10, atol=1e-10)
    params = [emb.weight, cell.weight, cell.bias]
    got = torch.autograd.grad(loss_of([outputs]), params)
    for g, w in zip(got, torch.autograd.grad(loss_of([want]), params), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_tree_lstm_classifier_matches_per_tree_loss(scheduler: Scheduler) -> None:
    torch.manual_seed(0)
    model = TreeLSTMClassifier(50, emb_dim=6, hidden=5, n_classes=5)
    for p in model.parameters():  # larger weights than the default, to exercise the gates
        nn.init.uniform_(p, -1.0, 1.0)
    model.to(DEV)
    trees = random_trees(12, 1, 10, rng=1, vocab_size=50)
    leaf, node = bf.function(model.cell.leaf, batched=True), bf.function(model.cell, batched=True)

    def batch_map_loss(fused: bool) -> torch.Tensor:
        cells = {"leaf": leaf, "node": node} if fused else {}
        losses = bf.batch_map(
            lambda t: tree_node_losses(model, t, **cells), trees, scheduler=scheduler
        )
        return torch.stack([loss for tree in losses for loss in tree]).sum()

    want = torch.stack([per_tree_loss(model, t) for t in trees]).sum()
    blocks = compile(tree_lstm_blocks(model), scheduler=scheduler)
    systems = {
        "batch_map, bf.function cells": batch_map_loss(fused=True),
        "batch_map, plain code": batch_map_loss(fused=False),
        "blocks": blocks(trees)[1]["loss"].sum(),
    }
    params = list(model.parameters())
    expected = [want, *torch.autograd.grad(want, params)]
    for name, loss in systems.items():
        got = [loss, *torch.autograd.grad(loss, params)]
        for g, w in zip(got, expected, strict=True):  # values, devices, then gradients
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10, msg=lambda m, n=name: n + m)


def test_a_device_named_without_its_index() -> None:
    model = TreeNet(device="cuda").to(DEV)
    assert_matches_eager(model, [(1, (2, 3)), 4], model)


def test_the_default_device() -> None:
    model = TreeNet(device=None).to(DEV)
    torch.set_default_device("cuda")
    try:
        assert_matches_eager(model, [(1, (2, 3)), 4], model)
    finally:
        torch.set_default_device(None)
