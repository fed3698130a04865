"""The plain-PyTorch Tree-LSTM baselines of benchmarks/baselines.py, checked in `make test`.

benchmarks/ is not a package and is never collected; this test puts it on ``sys.path`` to
import the baselines, as the benchmark scripts do when run from there.
"""

from __future__ import annotations

import dataclasses
import doctest
import random
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import baselines  # noqa: E402
from baselines import (  # noqa: E402
    RoutedTrees,
    flatten_trees,
    level_batched_loss,
    naive_batch_loss,
    route_trees,
    routed_level_batched_loss,
    routed_loss,
)
from batchfold.data.trees import BinaryTree, chain, complete_tree, random_trees  # noqa: E402
from batchfold.models.tree_lstm import TreeLSTMClassifier, per_tree_loss  # noqa: E402


def _model(seed: int = 0, vocab: int = 1000) -> TreeLSTMClassifier:
    torch.manual_seed(seed)
    model = TreeLSTMClassifier(vocab, emb_dim=7, hidden=5, n_classes=5).double()
    for p in model.parameters():  # larger weights than the default, to exercise the gates
        torch.nn.init.uniform_(p, -1.0, 1.0)
    return model


def _grads(model: torch.nn.Module, loss: torch.Tensor) -> list[torch.Tensor]:
    params = list(model.parameters())
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)]


def test_flatten_trees_levels():
    trees = [complete_tree(2, rng=0), BinaryTree.leaf(3, label=4), chain(4, rng=1)]
    flat = flatten_trees(trees)
    assert flat.n_nodes == 7 + 1 + 7
    assert flat.offsets == [0, 9, 12, 14, 15]  # 9 leaves; levels 1, 2, 3
    assert flat.words.tolist()[4] == 3
    assert flat.labels.tolist()[4] == 4
    assert flat.children.shape == (2 * 6,)
    # Every child sits on a lower level than its parent.
    parents = torch.arange(9, 15).repeat_interleave(2)
    assert bool((flat.children < parents).all())


@pytest.mark.parametrize(
    "trees",
    [
        random_trees(1, 5, 5, rng=0),  # a batch of one tree
        [BinaryTree.leaf(3, label=2)],  # a single leaf
        [BinaryTree.leaf(1), BinaryTree.leaf(2, label=4)],
        random_trees(8, 1, 12, rng=1),  # single-leaf trees included
        random_trees(20, 2, 60, rng=2),
        [chain(30, rng=3), complete_tree(4, rng=4), *random_trees(5, 1, 3, rng=5)],
    ],
)
def test_level_batched_matches_naive(trees: list[BinaryTree]):
    model = _model()
    naive = naive_batch_loss(model, trees)
    batched = level_batched_loss(model, trees)
    assert naive.dtype == torch.float64
    torch.testing.assert_close(batched, naive, rtol=1e-10, atol=0)
    for g_batched, g_naive in zip(_grads(model, batched), _grads(model, naive), strict=True):
        torch.testing.assert_close(g_batched, g_naive, rtol=1e-10, atol=1e-12)


def test_naive_sums_per_tree_losses():
    model = _model(seed=3)
    trees = random_trees(3, 1, 10, rng=6)
    total = sum(per_tree_loss(model, t).item() for t in trees)
    assert naive_batch_loss(model, trees).item() == pytest.approx(total, rel=1e-12)


@pytest.mark.parametrize("loss_fn", [level_batched_loss, routed_level_batched_loss])
def test_float32_training_step_runs(loss_fn):
    torch.manual_seed(0)
    model = TreeLSTMClassifier(100, emb_dim=16, hidden=8, dropout=0.2)
    sgd = torch.optim.SGD(model.parameters(), lr=0.002)
    trees = random_trees(16, 2, 20, rng=0, vocab_size=100)
    model.eval()
    before = loss_fn(model, trees).item()
    model.train()
    for _ in range(10):
        sgd.zero_grad()
        loss_fn(model, trees).backward()
        sgd.step()
    model.eval()
    assert loss_fn(model, trees).item() < before


# ----------------------------------------------------------------------------------------------
# The routed level batching


def _mirror(tree: BinaryTree) -> BinaryTree:
    """The tree with every node's children swapped (a left-deep chain becomes right-deep)."""
    stack: list[BinaryTree] = []
    for node in tree.nodes():
        if node.left is None:
            stack.append(node)
        else:
            right, left = stack.pop(), stack.pop()
            stack.append(BinaryTree.node(right, left, node.label))
    return stack[0]


def _mixed_batch(seed: int) -> list[BinaryTree]:
    """Random, single-leaf, chain-like (both ways) and complete trees, shuffled."""
    trees = [
        *random_trees(12, 1, 40, rng=seed),
        BinaryTree.leaf(5, label=1),
        BinaryTree.leaf(6, label=3),
        chain(25, rng=seed + 1),
        _mirror(chain(17, rng=seed + 2)),
        _mirror(random_trees(1, 30, 30, rng=seed + 3)[0]),
        complete_tree(3, rng=seed + 4),
    ]
    random.Random(seed).shuffle(trees)
    return trees


ROUTED_BATCHES = [
    [BinaryTree.leaf(3, label=2)],  # a single leaf: no internal level, no routing
    [BinaryTree.leaf(1), BinaryTree.leaf(2, label=4)],
    random_trees(1, 5, 5, rng=0),
    [chain(40, rng=1)],  # one node per level, a leaf into every level
    [_mirror(chain(40, rng=2)), BinaryTree.leaf(9)],
    random_trees(8, 1, 12, rng=1),  # single-leaf trees included
    random_trees(20, 2, 60, rng=2),
    _mixed_batch(0),
    _mixed_batch(1),
]


def _routed_children(plan: RoutedTrees) -> torch.Tensor:
    """The children's positions that the plan's routing delivers to every internal node.

    Runs the plan's routing on level-order positions in place of states (as
    :func:`routed_loss` routes ``h`` and ``c``), gives ``l0, r0, l1, r1, ...`` as in
    :attr:`FlatTrees.children`.
    """
    off = plan.offsets
    inbox: list[list[torch.Tensor]] = [[] for _ in plan.routes]
    out = []
    for k, (index, sizes, targets) in enumerate(plan.routes):
        rows = torch.arange(off[k], off[k + 1])
        if k:
            incoming = torch.cat(inbox[k])
            out.append(incoming[plan.gathers[k - 1]])
        routed = rows[: sum(sizes)] if index is None else rows[index]
        for target, piece in zip(targets, routed.split(sizes), strict=True):
            assert target > k
            inbox[target].append(piece)
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.int64)


@pytest.mark.parametrize("trees", ROUTED_BATCHES)
def test_route_trees_matches_flatten(trees: list[BinaryTree]):
    plan, flat = route_trees(trees), flatten_trees(trees)
    assert plan.offsets == flat.offsets
    assert plan.n_nodes == sum(t.size for t in trees)
    assert torch.equal(plan.words, flat.words)
    assert torch.equal(plan.labels, flat.labels)
    assert torch.equal(_routed_children(plan), flat.children)
    # Every non-root row is routed exactly once; pieces go to strictly higher levels.
    n_roots = len(trees)
    routed = sum(sum(sizes) for _, sizes, _ in plan.routes)
    assert routed == plan.n_nodes - n_roots
    for index, sizes, targets in plan.routes:
        assert targets == sorted(targets) and 0 not in sizes
        if index is not None:
            assert len(set(index.tolist())) == len(index) == sum(sizes)


def test_route_trees_groups_by_consuming_level():
    # A leaf that is a root first, then a chain: level 0's rows 1, 2 go to level 1, row 3 to
    # level 2, and row 0 nowhere.
    plan = route_trees([BinaryTree.leaf(7), chain(3)])
    index, sizes, targets = plan.routes[0]
    assert index is not None and index.tolist() == [1, 2, 3]
    assert (sizes, targets) == ([2, 1], [1, 2])
    assert [g.tolist() for g in plan.gathers] == [[0, 1], [1, 0]]
    assert plan.routes[2] == (None, [], [])


@pytest.mark.parametrize("trees", ROUTED_BATCHES)
def test_routed_matches_naive(trees: list[BinaryTree]):
    model = _model()
    naive = naive_batch_loss(model, trees)
    routed = routed_level_batched_loss(model, trees)
    assert routed.dtype == torch.float64
    torch.testing.assert_close(routed, naive, rtol=1e-10, atol=0)
    torch.testing.assert_close(routed, level_batched_loss(model, trees), rtol=1e-12, atol=0)
    for g_routed, g_naive in zip(_grads(model, routed), _grads(model, naive), strict=True):
        torch.testing.assert_close(g_routed, g_naive, rtol=1e-10, atol=1e-12)


def _matches_naive(model: TreeLSTMClassifier, plan: RoutedTrees, trees: list[BinaryTree]) -> bool:
    routed, naive = routed_loss(model, plan), naive_batch_loss(model, trees)
    pairs = [(routed, naive), *zip(_grads(model, routed), _grads(model, naive), strict=True)]
    return all(torch.allclose(a, b, rtol=1e-10, atol=1e-12) for a, b in pairs)


def _shuffled(index: torch.Tensor, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    while True:
        out = index[torch.randperm(len(index), generator=gen)]
        if not torch.equal(out, index):
            return out


@pytest.mark.parametrize("part", ["route", "gather", "labels"])
def test_routed_comparison_catches_wrong_routing(part: str):
    """The comparison with the naive run fails when any index of the plan is shuffled."""
    model = _model()
    trees = _mixed_batch(2)
    plan = route_trees(trees)
    assert _matches_naive(model, plan, trees)
    tried = 0
    for k in range(len(plan.routes) if part == "route" else len(plan.gathers)):
        if part == "route":
            index, sizes, targets = plan.routes[k]
            if index is None or len(index) < 2:
                continue
            routes = list(plan.routes)
            routes[k] = (_shuffled(index, k), sizes, targets)
            bad = dataclasses.replace(plan, routes=routes)
        elif part == "gather":
            if len(plan.gathers[k]) < 4:  # one node: a swap of its children may not show
                continue
            gathers = list(plan.gathers)
            gathers[k] = _shuffled(gathers[k], k)
            bad = dataclasses.replace(plan, gathers=gathers)
        else:
            bad = dataclasses.replace(plan, labels=_shuffled(plan.labels, k))
        assert not _matches_naive(model, bad, trees), (part, k)
        tried += 1
    assert tried >= 3


def test_routed_deep_chain():
    trees = [chain(600, rng=0), _mirror(chain(300, rng=1)), *random_trees(4, 1, 30, rng=2)]
    model = _model()
    plan = route_trees(trees)
    assert len(plan.offsets) - 1 == 600
    naive = naive_batch_loss(model, trees)
    torch.testing.assert_close(routed_loss(model, plan), naive, rtol=1e-10, atol=0)


def test_doctests() -> None:
    failed, attempted = doctest.testmod(baselines, optionflags=doctest.ELLIPSIS)
    assert attempted > 0 and failed == 0
