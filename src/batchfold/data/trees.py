"""Random structures for synthetic work: binary trees, small DAGs and sequences.

Trees are :class:`BinaryTree` values with a word id at every leaf and a class label at every
node. Every traversal here is iterative, so chains thousands of nodes deep are fine. The DAG
and sequence generators are in :mod:`batchfold.data.synthetic` and importable from here as well.

The generators take a :class:`random.Random`, an integer seed, or ``None`` (a fixed seed of 0),
and the same seed always gives the same structures.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from batchfold.data.synthetic import RngLike, as_random, random_dag, random_sequences

__all__ = [
    "BinaryTree",
    "chain",
    "complete_tree",
    "random_dag",
    "random_sequences",
    "random_tree",
    "random_trees",
]


@dataclass(frozen=True, slots=True)
class BinaryTree:
    """A binary tree node: a leaf holding a word id, or an internal node with two children.

    Arguments:
        word: the word id of a leaf; ``None`` on internal nodes (it is ignored there).
        left: the left child, or ``None`` for a leaf.
        right: the right child, or ``None`` for a leaf.
        label: the node's class label.

    Equality, hashing and ``repr`` work iteratively, so very deep trees are fine. The ``repr``
    is the bracketed form ``(label word)`` for leaves and ``(label left right)`` otherwise.

    Example:
        >>> t = BinaryTree(None, BinaryTree(4, None, None, 1), BinaryTree(7, None, None, 2), 3)
        >>> t
        BinaryTree('(3 (1 4) (2 7))')
        >>> t.size, t.depth, t.is_leaf, [n.label for n in t.nodes()]
        (3, 1, False, [1, 2, 3])
    """

    word: int | None
    left: BinaryTree | None
    right: BinaryTree | None
    label: int = 0

    def __post_init__(self) -> None:
        if (self.left is None) != (self.right is None):
            raise ValueError("a BinaryTree node has either two children or none")
        if self.left is None and self.word is None:
            raise ValueError("a leaf needs a word id")

    @staticmethod
    def leaf(word: int, label: int = 0) -> BinaryTree:
        """A leaf node.

        Arguments:
            word: the word id.
            label: the class label.

        Returns:
            The new leaf.

        Example:
            >>> BinaryTree.leaf(5, label=2)
            BinaryTree('(2 5)')
        """
        return BinaryTree(word, None, None, label)

    @staticmethod
    def node(left: BinaryTree, right: BinaryTree, label: int = 0) -> BinaryTree:
        """An internal node over two subtrees.

        Arguments:
            left: the left subtree.
            right: the right subtree.
            label: the class label.

        Returns:
            The new node.

        Example:
            >>> BinaryTree.node(BinaryTree.leaf(1), BinaryTree.leaf(2), label=4)
            BinaryTree('(4 (0 1) (0 2))')
        """
        return BinaryTree(None, left, right, label)

    @property
    def is_leaf(self) -> bool:
        """Whether this node has no children."""
        return self.left is None

    @property
    def size(self) -> int:
        """The number of nodes in the tree (leaves and internal nodes)."""
        return sum(1 for _ in self.nodes())

    @property
    def n_leaves(self) -> int:
        """The number of leaves in the tree."""
        return sum(1 for n in self.nodes() if n.left is None)

    @property
    def depth(self) -> int:
        """The number of edges on the longest root-to-leaf path (0 for a single leaf)."""
        deepest = 0
        stack: list[tuple[BinaryTree, int]] = [(self, 0)]
        while stack:
            node, d = stack.pop()
            if node.left is None or node.right is None:
                deepest = max(deepest, d)
            else:
                stack.append((node.right, d + 1))
                stack.append((node.left, d + 1))
        return deepest

    def nodes(self) -> Iterator[BinaryTree]:
        """All nodes in post-order (left subtree, right subtree, node), without recursion.

        Returns:
            An iterator over the nodes; every child comes before its parent.

        Example:
            >>> [n.is_leaf for n in chain(3).nodes()]
            [True, True, False, True, False]
        """
        stack: list[tuple[BinaryTree, bool]] = [(self, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded or node.left is None or node.right is None:
                yield node
            else:
                stack.append((node, True))
                stack.append((node.right, False))
                stack.append((node.left, False))

    def leaves(self) -> list[int]:
        """The word ids of the leaves, left to right.

        Returns:
            A list of word ids.

        Example:
            >>> complete_tree(2, rng=1, vocab_size=10).leaves()
            [2, 1, 1, 7]
        """
        return [n.word for n in self.nodes() if n.word is not None and n.left is None]

    def _tokens(self) -> Iterator[tuple[int, int | None, int]]:
        """The tree in pre-order as ``(kind, word, label)``; kind 0 leaf, 1 internal."""
        stack: list[BinaryTree] = [self]
        while stack:
            node = stack.pop()
            if node.left is None or node.right is None:
                yield (0, node.word, node.label)
            else:
                yield (1, None, node.label)
                stack.append(node.right)
                stack.append(node.left)

    def to_string(self) -> str:
        """The bracketed form: ``(label word)`` for a leaf, ``(label left right)`` otherwise.

        Returns:
            The tree as one line of text.

        Example:
            >>> chain(3, rng=0, vocab_size=9, n_classes=1).to_string()
            '(0 (0 (0 6) (0 0)) (0 6))'
        """
        parts: list[str] = []
        stack: list[BinaryTree | str] = [self]
        while stack:
            item = stack.pop()
            if isinstance(item, str):
                parts.append(item)
            elif item.left is None or item.right is None:
                parts.append(f"({item.label} {item.word})")
            else:
                stack += [")", item.right, " ", item.left, f"({item.label} "]
        return "".join(parts)

    def __repr__(self) -> str:
        return f"BinaryTree({self.to_string()!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BinaryTree):
            return NotImplemented
        if self is other:
            return True
        stack: list[tuple[BinaryTree, BinaryTree]] = [(self, other)]
        while stack:
            a, b = stack.pop()
            if a is b:
                continue
            if a.word != b.word or a.label != b.label or a.is_leaf != b.is_leaf:
                return False
            if a.left is not None and a.right is not None:
                assert b.left is not None and b.right is not None
                stack.append((a.right, b.right))
                stack.append((a.left, b.left))
        return True

    def __hash__(self) -> int:
        return hash(tuple(self._tokens()))


def random_tree(
    n_leaves: int, rng: RngLike = None, vocab_size: int = 1000, n_classes: int = 5
) -> BinaryTree:
    """A random binary tree with ``n_leaves`` leaves; each split point is uniform at random.

    A node over ``k >= 2`` leaves gives its left subtree ``uniform{1, ..., k-1}`` of them (the
    "random" trees of TensorFlow Fold's benchmark). Leaves get uniform word ids in
    ``[0, vocab_size)``; every node gets a uniform label in ``[0, n_classes)``.

    Arguments:
        n_leaves: the number of leaves (at least 1).
        rng: a :class:`random.Random`, a seed, or ``None`` for seed 0.
        vocab_size: the number of distinct word ids.
        n_classes: the number of distinct labels.

    Returns:
        The tree.

    Example:
        >>> t = random_tree(10, rng=3)
        >>> t.n_leaves, t.size, t == random_tree(10, rng=3)
        (10, 19, True)
    """
    if n_leaves < 1:
        raise ValueError(f"a tree needs at least one leaf, got n_leaves={n_leaves}")
    r = as_random(rng)
    # Plan the shape top-down in pre-order: children always get larger indices than parents.
    counts: list[int] = [n_leaves]
    kids: list[tuple[int, int] | None] = [None]
    todo = [0]
    while todo:
        i = todo.pop()
        k = counts[i]
        if k == 1:
            continue
        n_left = r.randint(1, k - 1)
        left, right = len(counts), len(counts) + 1
        counts += [n_left, k - n_left]
        kids += [None, None]
        kids[i] = (left, right)
        todo += [right, left]
    # Build bottom-up.
    built: list[BinaryTree | None] = [None] * len(counts)
    for i in range(len(counts) - 1, -1, -1):
        label = r.randrange(n_classes)
        pair = kids[i]
        if pair is None:
            built[i] = BinaryTree(r.randrange(vocab_size), None, None, label)
        else:
            built[i] = BinaryTree(None, built[pair[0]], built[pair[1]], label)
            built[pair[0]] = built[pair[1]] = None
    root = built[0]
    assert root is not None
    return root


def random_trees(
    count: int,
    min_leaves: int,
    max_leaves: int,
    rng: RngLike = None,
    vocab_size: int = 1000,
    n_classes: int = 5,
) -> list[BinaryTree]:
    """``count`` random trees (see :func:`random_tree`), leaf counts uniform in a range.

    Arguments:
        count: how many trees.
        min_leaves: the smallest leaf count (at least 1).
        max_leaves: the largest leaf count (inclusive).
        rng: a :class:`random.Random`, a seed, or ``None`` for seed 0.
        vocab_size: the number of distinct word ids.
        n_classes: the number of distinct labels.

    Returns:
        A list of trees.

    Example:
        >>> trees = random_trees(50, 2, 60, rng=7)
        >>> len(trees), all(2 <= t.n_leaves <= 60 for t in trees)
        (50, True)
    """
    if not 1 <= min_leaves <= max_leaves:
        raise ValueError(f"need 1 <= min_leaves <= max_leaves, got {min_leaves}, {max_leaves}")
    r = as_random(rng)
    return [
        random_tree(r.randint(min_leaves, max_leaves), r, vocab_size, n_classes)
        for _ in range(count)
    ]


def complete_tree(
    depth: int | None = None,
    *,
    n_leaves: int | None = None,
    rng: RngLike = None,
    vocab_size: int = 1000,
    n_classes: int = 5,
) -> BinaryTree:
    """A complete binary tree, given its depth or its leaf count (a power of two).

    Arguments:
        depth: the depth (0 is a single leaf); give this or ``n_leaves``.
        n_leaves: the leaf count, a power of two.
        rng: a :class:`random.Random`, a seed, or ``None`` for seed 0.
        vocab_size: the number of distinct word ids.
        n_classes: the number of distinct labels.

    Returns:
        The tree, with ``2**depth`` leaves.

    Example:
        >>> t = complete_tree(n_leaves=8)
        >>> t.depth, t.size
        (3, 15)
    """
    if (depth is None) == (n_leaves is None):
        raise ValueError("give exactly one of depth and n_leaves")
    if n_leaves is not None:
        if n_leaves < 1 or n_leaves & (n_leaves - 1):
            raise ValueError(f"n_leaves must be a power of two, got {n_leaves}")
        depth = n_leaves.bit_length() - 1
    assert depth is not None
    if depth < 0:
        raise ValueError(f"depth must be >= 0, got {depth}")
    r = as_random(rng)
    level = [
        BinaryTree(r.randrange(vocab_size), None, None, r.randrange(n_classes))
        for _ in range(2**depth)
    ]
    while len(level) > 1:
        level = [
            BinaryTree(None, level[i], level[i + 1], r.randrange(n_classes))
            for i in range(0, len(level), 2)
        ]
    return level[0]


def chain(
    n_leaves: int, rng: RngLike = None, vocab_size: int = 1000, n_classes: int = 5
) -> BinaryTree:
    """A left-deep chain: every internal node has a leaf as its right child.

    Arguments:
        n_leaves: the number of leaves; the depth is ``n_leaves - 1``.
        rng: a :class:`random.Random`, a seed, or ``None`` for seed 0.
        vocab_size: the number of distinct word ids.
        n_classes: the number of distinct labels.

    Returns:
        The tree.

    Example:
        >>> chain(10_001).depth
        10000
    """
    if n_leaves < 1:
        raise ValueError(f"a tree needs at least one leaf, got n_leaves={n_leaves}")
    r = as_random(rng)
    tree = BinaryTree(r.randrange(vocab_size), None, None, r.randrange(n_classes))
    for _ in range(n_leaves - 1):
        right = BinaryTree(r.randrange(vocab_size), None, None, r.randrange(n_classes))
        tree = BinaryTree(None, tree, right, r.randrange(n_classes))
    return tree
