"""Random DAGs and sequences of word ids for synthetic work, and the random source they take.

Every generator here and in :mod:`batchfold.data.trees` takes a :class:`random.Random`, an
integer seed, or ``None`` (a fixed seed of 0), and the same seed always gives the same
structures.
"""

from __future__ import annotations

import random

__all__ = [
    "RngLike",
    "as_random",
    "random_dag",
    "random_sequences",
]

RngLike = random.Random | int | None
"""A random source: a :class:`random.Random`, an integer seed, or ``None`` (seed 0)."""


def as_random(rng: RngLike) -> random.Random:
    """A :class:`random.Random` from a generator, a seed, or ``None`` (seed 0).

    Example:
        >>> as_random(7).random() == as_random(random.Random(7)).random()
        True
    """
    if isinstance(rng, random.Random):
        return rng
    return random.Random(0 if rng is None else rng)


def random_dag(
    n_nodes: int,
    rng: RngLike = None,
    n_sources: int = 1,
    min_parents: int = 1,
    max_parents: int = 3,
) -> list[list[int]]:
    """A small random DAG in topological order, as lists of parent indices.

    Node ``i`` lists its parents, all of them earlier nodes, sorted. The first ``n_sources``
    nodes have none; every later node has between ``min_parents`` and ``max_parents`` distinct
    parents (fewer where fewer earlier nodes exist), chosen uniformly.

    Arguments:
        n_nodes: the number of nodes.
        rng: a :class:`random.Random`, a seed, or ``None`` for seed 0.
        n_sources: how many leading nodes have no parents (at least 1 when ``n_nodes > 0``).
        min_parents: the least number of parents of a non-source node (at least 1).
        max_parents: the most number of parents of a node.

    Returns:
        ``parents`` with ``parents[i]`` the sorted parent indices of node ``i``.

    Example:
        >>> dag = random_dag(6, rng=2)
        >>> dag[0], all(all(p < i for p in ps) for i, ps in enumerate(dag))
        ([], True)
        >>> all(1 <= len(ps) <= 3 for ps in dag[1:])
        True
    """
    if n_nodes > 0 and n_sources < 1:
        raise ValueError("a non-empty DAG has at least one source")
    if not 1 <= min_parents <= max_parents:
        raise ValueError(f"need 1 <= min_parents <= max_parents, got {min_parents}, {max_parents}")
    r = as_random(rng)
    parents: list[list[int]] = []
    for i in range(n_nodes):
        if i < n_sources:
            parents.append([])
            continue
        k = r.randint(min(min_parents, i), min(max_parents, i))
        parents.append(sorted(r.sample(range(i), k)))
    return parents


def random_sequences(
    count: int, min_len: int, max_len: int, vocab: int, rng: RngLike = None
) -> list[list[int]]:
    """``count`` random sequences of word ids, lengths uniform in ``[min_len, max_len]``.

    Arguments:
        count: how many sequences.
        min_len: the shortest length (0 allowed).
        max_len: the longest length (inclusive).
        vocab: word ids are uniform in ``[0, vocab)``.
        rng: a :class:`random.Random`, a seed, or ``None`` for seed 0.

    Returns:
        A list of lists of word ids.

    Example:
        >>> seqs = random_sequences(3, 1, 4, vocab=10, rng=5)
        >>> [1 <= len(s) <= 4 for s in seqs], all(0 <= w < 10 for s in seqs for w in s)
        ([True, True, True], True)
    """
    if not 0 <= min_len <= max_len:
        raise ValueError(f"need 0 <= min_len <= max_len, got {min_len}, {max_len}")
    r = as_random(rng)
    return [[r.randrange(vocab) for _ in range(r.randint(min_len, max_len))] for _ in range(count)]
