from __future__ import annotations

import random

import pytest

from batchfold.data.trees import (
    BinaryTree,
    chain,
    complete_tree,
    random_dag,
    random_sequences,
    random_tree,
    random_trees,
)


def test_random_tree_counts_and_labels():
    for n in [1, 2, 3, 17, 60]:
        t = random_tree(n, random.Random(n), vocab_size=7, n_classes=5)
        nodes = list(t.nodes())
        assert t.n_leaves == n
        assert t.size == len(nodes) == 2 * n - 1
        assert all(0 <= node.label < 5 for node in nodes)
        assert all(0 <= w < 7 for w in t.leaves())
        assert all((node.left is None) == (node.right is None) for node in nodes)


def test_random_tree_split_is_uniform():
    # With 4 leaves the root's left subtree has 1, 2 or 3 leaves, each with probability 1/3.
    rng = random.Random(0)
    counts = [0, 0, 0, 0]
    for _ in range(3000):
        t = random_tree(4, rng)
        assert t.left is not None
        counts[t.left.n_leaves] += 1
    assert counts[0] == 0
    assert all(900 < c < 1100 for c in counts[1:])


def test_random_trees_leaf_range_and_determinism():
    trees = random_trees(300, 2, 60, rng=11)
    sizes = [t.n_leaves for t in trees]
    assert len(trees) == 300
    assert min(sizes) >= 2 and max(sizes) <= 60
    assert min(sizes) <= 4 and max(sizes) >= 58  # the range is covered
    assert trees == random_trees(300, 2, 60, rng=11)
    assert trees == random_trees(300, 2, 60, rng=random.Random(11))
    assert trees != random_trees(300, 2, 60, rng=12)
    assert random_trees(4, 3, 3, rng=0)[0].n_leaves == 3


def test_complete_tree():
    for depth in range(5):
        t = complete_tree(depth, rng=depth)
        assert t.depth == depth
        assert t.n_leaves == 2**depth
        assert t == complete_tree(n_leaves=2**depth, rng=depth)
    with pytest.raises(ValueError):
        complete_tree(n_leaves=6)
    with pytest.raises(ValueError):
        complete_tree()


def test_chain_10000_deep():
    t = chain(10_001, rng=0)
    assert t.depth == 10_000
    assert t.size == 20_001
    assert t.n_leaves == 10_001
    nodes = list(t.nodes())
    assert nodes[-1] is t
    assert nodes[0].is_leaf and nodes[1].is_leaf and not nodes[2].is_leaf
    # Equality, hashing and repr do not recurse either.
    assert t == chain(10_001, rng=0)
    assert hash(t) == hash(chain(10_001, rng=0))
    assert repr(t).startswith("BinaryTree('(")


def test_post_order_children_first():
    t = random_tree(30, rng=5)
    seen: set[int] = set()
    for node in t.nodes():
        if not node.is_leaf:
            assert id(node.left) in seen and id(node.right) in seen
        seen.add(id(node))


def test_binary_tree_validation_and_repr():
    leaf = BinaryTree.leaf(3, label=1)
    with pytest.raises(ValueError):
        BinaryTree(None, leaf, None)
    with pytest.raises(ValueError):
        BinaryTree(None, None, None)
    t = BinaryTree.node(leaf, BinaryTree.node(leaf, leaf, 2), 4)
    assert t.to_string() == "(4 (1 3) (2 (1 3) (1 3)))"
    assert t.depth == 2 and t.size == 5
    assert t != BinaryTree.node(leaf, BinaryTree.node(leaf, leaf, 3), 4)


def test_random_dag():
    for seed in range(20):
        dag = random_dag(30, rng=seed, n_sources=2)
        assert len(dag) == 30
        assert dag[0] == [] and dag[1] == []
        for i, parents in enumerate(dag[2:], start=2):
            assert 1 <= len(parents) <= 3
            assert parents == sorted(set(parents))
            assert all(0 <= p < i for p in parents)
        assert dag == random_dag(30, rng=seed, n_sources=2)
    assert random_dag(0) == []


def test_random_sequences():
    seqs = random_sequences(200, 0, 9, vocab=13, rng=3)
    assert len(seqs) == 200
    assert {len(s) for s in seqs} == set(range(10))
    assert all(0 <= w < 13 for s in seqs for w in s)
    assert seqs == random_sequences(200, 0, 9, vocab=13, rng=3)
