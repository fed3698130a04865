"""Timing helpers and the plain-PyTorch baselines that batchfold's benchmarks compare against.

The baselines are executions of :class:`~batchfold.models.tree_lstm.TreeLSTMClassifier` on a
batch of :class:`~batchfold.data.trees.BinaryTree`, all summing the cross-entropy of every
node's label:

* :func:`naive_batch_loss` (via :func:`~batchfold.models.tree_lstm.per_tree_loss`): one node at
  a time, no batching.
* :func:`routed_level_batched_loss`: hand-written batching by level (height above the leaves),
  the strongest we know: all leaves in one call, then one cell call per level. Each level's
  states are produced once and routed, with one ``index_select`` and a ``split``, into pieces
  for the levels that consume them; a level concatenates its incoming pieces and gathers its
  children with one ``index_select``. Forward and backward are linear in the number of nodes.
* :func:`level_batched_loss`: the same level batching, but each level gathers its children
  from the states of all levels below, concatenated again at every level (quadratic in the
  number of levels); kept for comparison.

All give the same loss and gradients (up to rounding); tests/benchmarks/test_baselines.py
checks them against each other and against the model's one-tree loss.

A *runner* is a callable taking a batch of trees and returning a scalar loss. The helpers time a
training step (forward, backward, optimizer step) or an inference call (forward only, no
gradients) with warm-up calls first and the median of the repeats reported, measured with
:func:`time.perf_counter`. Each call gets the next batch of a fixed list, so per-batch work
(flattening, scheduling) is part of what is measured.

Run as a script, it compares the naive and the two level-batched Tree-LSTMs on random trees::

    python benchmarks/baselines.py --threads 2
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

import batchfold as bf
from batchfold.data.trees import BinaryTree, random_trees
from batchfold.models.tree_lstm import TreeLSTMClassifier, per_tree_loss

__all__ = [
    "FlatTrees",
    "RoutedTrees",
    "Runner",
    "Timing",
    "flatten_trees",
    "level_batched_loss",
    "make_batches",
    "naive_batch_loss",
    "route_trees",
    "routed_level_batched_loss",
    "routed_loss",
    "split_fields",
    "synchronize",
    "time_inference",
    "time_training",
    "timing_fields",
    "training_step",
    "tree_lstm_baselines",
]

Runner = Callable[[Sequence[BinaryTree]], Tensor]
"""Computes the scalar loss of a batch of trees."""


@dataclass(frozen=True)
class Timing:
    """Wall-clock times of repeated calls on batches of a fixed size.

    Arguments:
        times: seconds per call, one per repeat (warm-up calls excluded).
        batch_size: trees per call.

    Example:
        >>> t = Timing([0.5, 0.25, 1.0], batch_size=10)
        >>> t.median_s, t.trees_per_s
        (0.5, 20.0)
    """

    times: list[float]
    batch_size: int

    @property
    def median_s(self) -> float:
        """The median seconds per call."""
        return statistics.median(self.times)

    @property
    def trees_per_s(self) -> float:
        """Throughput at the median: trees per second."""
        return self.batch_size / self.median_s


def timing_fields(timing: Timing) -> dict[str, Any]:
    """A results row's fields for a timing: throughput, median, spread and every time."""
    return {
        "trees_per_s": timing.trees_per_s,
        "median_s": timing.median_s,
        "min_s": min(timing.times),
        "max_s": max(timing.times),
        "times_s": timing.times,
    }


def split_fields(stats: Sequence[bf.Stats]) -> dict[str, Any]:
    """A results row's fields for batchfold's record / schedule / execute split.

    Medians over the timed calls' statistics; ``execute_s`` is the forward's execution, and
    the graph's sizes are those of the last call.
    """
    return {
        "record_s": statistics.median(s.record_s for s in stats),
        "record_us_per_node": 1e6 * statistics.median(s.record_s / s.nodes for s in stats),
        "schedule_s": statistics.median(s.schedule_s for s in stats),
        "execute_s": statistics.median(s.execute_s for s in stats),
        "nodes": stats[-1].nodes,
        "steps": stats[-1].steps,
        "mean_batch": stats[-1].mean_batch,
        "fallbacks": stats[-1].fallbacks,
    }


def loss_and_grads(
    name: str,
    runner: Callable[[Sequence[Any]], Tensor],
    model: torch.nn.Module,
    items: Sequence[Any],
) -> list[Tensor]:
    """A batch's loss and the gradient of every parameter of ``model`` (system ``name``).

    Raises:
        RuntimeError: the system left a parameter without a gradient.
    """
    model.zero_grad(set_to_none=True)
    loss = runner(items)
    loss.backward()
    out = [loss.detach()]
    for param_name, param in model.named_parameters():
        if param.grad is None:
            raise RuntimeError(f"{name} left {param_name} without a gradient")
        out.append(param.grad.clone())
    model.zero_grad(set_to_none=True)
    return out


def synchronize() -> None:
    """Wait for queued GPU work, so that timings cover it (does nothing on CPU only)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def make_batches(
    n_batches: int,
    batch_size: int,
    min_leaves: int = 2,
    max_leaves: int = 60,
    vocab_size: int = 1000,
    n_classes: int = 5,
    seed: int = 0,
) -> list[list[BinaryTree]]:
    """Batches of random trees (uniform split points, leaf counts uniform in a range).

    Arguments:
        n_batches: how many batches.
        batch_size: trees per batch.
        min_leaves: the smallest leaf count.
        max_leaves: the largest leaf count.
        vocab_size: word ids are uniform in ``[0, vocab_size)``.
        n_classes: labels are uniform in ``[0, n_classes)``.
        seed: the random seed.

    Returns:
        A list of ``n_batches`` lists of ``batch_size`` trees.

    Example:
        >>> [len(b) for b in make_batches(3, 4)]
        [4, 4, 4]
    """
    trees = random_trees(
        n_batches * batch_size, min_leaves, max_leaves, seed, vocab_size, n_classes
    )
    return [trees[i * batch_size : (i + 1) * batch_size] for i in range(n_batches)]


def training_step(
    runner: Runner, batch: Sequence[BinaryTree], optimizer: torch.optim.Optimizer
) -> float:
    """One training step: loss, backward pass and optimizer step.

    Arguments:
        runner: computes the batch's loss.
        batch: the trees.
        optimizer: updates the parameters the loss depends on.

    Returns:
        The loss before the step.
    """
    optimizer.zero_grad(set_to_none=True)
    loss = runner(batch)
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def _time(
    call: Callable[[Sequence[BinaryTree]], object],
    batches: Sequence[Sequence[BinaryTree]],
    warmup: int,
    repeats: int,
) -> list[float]:
    """Seconds of each of ``repeats`` calls after ``warmup`` calls, cycling through batches."""
    if not batches:
        raise ValueError("need at least one batch")
    for i in range(warmup):
        call(batches[i % len(batches)])
    synchronize()
    times = []
    for i in range(warmup, warmup + repeats):
        start = time.perf_counter()
        call(batches[i % len(batches)])
        synchronize()
        times.append(time.perf_counter() - start)
    return times


def time_training(
    runner: Runner,
    batches: Sequence[Sequence[BinaryTree]],
    optimizer: torch.optim.Optimizer,
    warmup: int = 1,
    repeats: int = 5,
    restore: bool = True,
) -> Timing:
    """Time training steps (see :func:`training_step`) of a runner.

    The parameters and the optimizer's state are put back afterwards (unless ``restore`` is
    false), so that every measurement starts from the same weights: weights that drift far
    (diverging training) make arithmetic slower and timings meaningless.

    Arguments:
        runner: computes a batch's loss.
        batches: the batches, used in turn (all of the same size).
        optimizer: updates the parameters.
        warmup: untimed steps first.
        repeats: timed steps.
        restore: put the parameters and optimizer state back afterwards.

    Returns:
        The timings.

    Example:
        >>> model = TreeLSTMClassifier(1000, emb_dim=8, hidden=4)
        >>> sgd = torch.optim.SGD(model.parameters(), lr=0.01)
        >>> before = model.output.weight.clone()
        >>> t = time_training(partial(level_batched_loss, model), make_batches(2, 3), sgd)
        >>> len(t.times), t.batch_size, torch.equal(model.output.weight, before)
        (5, 3, True)
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    saved = [p.detach().clone() for p in params] if restore else []
    saved_state = copy.deepcopy(optimizer.state_dict())
    times = _time(partial(training_step, runner, optimizer=optimizer), batches, warmup, repeats)
    if restore:
        with torch.no_grad():
            for p, value in zip(params, saved, strict=True):
                p.copy_(value)
        optimizer.load_state_dict(saved_state)
    return Timing(times, len(batches[0]))


def time_inference(
    runner: Runner,
    batches: Sequence[Sequence[BinaryTree]],
    warmup: int = 1,
    repeats: int = 5,
) -> Timing:
    """Time forward passes of a runner with gradients off.

    Arguments:
        runner: computes a batch's loss (or outputs).
        batches: the batches, used in turn (all of the same size).
        warmup: untimed calls first.
        repeats: timed calls.

    Returns:
        The timings.

    Example:
        >>> model = TreeLSTMClassifier(1000, emb_dim=8, hidden=4)
        >>> t = time_inference(partial(naive_batch_loss, model), make_batches(2, 3), repeats=2)
        >>> len(t.times)
        2
    """

    def call(batch: Sequence[BinaryTree]) -> None:
        with torch.no_grad():
            runner(batch)

    return Timing(_time(call, batches, warmup, repeats), len(batches[0]))


# ----------------------------------------------------------------------------------------------
# The Tree-LSTM baselines


def naive_batch_loss(model: TreeLSTMClassifier, trees: Sequence[BinaryTree]) -> Tensor:
    """The summed node loss of a batch of trees, one tree and one node at a time.

    Arguments:
        model: the classifier.
        trees: the batch.

    Returns:
        A scalar loss, the sum of :func:`per_tree_loss` over the trees.
    """
    return torch.stack([per_tree_loss(model, t) for t in trees]).sum()


@dataclass(frozen=True)
class FlatTrees:
    """A batch of trees flattened into index arrays, with nodes ordered by level.

    Level ``k`` is a node's height above the leaves (leaves are level 0). Positions
    ``offsets[k]:offsets[k + 1]`` hold the nodes of level ``k``, so the leaves come first.

    Arguments:
        words: the word ids of the leaves, ``[n_leaves]`` (int64).
        labels: every node's label in level order, ``[n_nodes]`` (int64).
        children: for the internal nodes in level order, their children's positions
            interleaved ``l0, r0, l1, r1, ...``, ``[2 * (n_nodes - n_leaves)]`` (int64).
        offsets: level boundaries, ``[n_levels + 1]``.
    """

    words: Tensor
    labels: Tensor
    children: Tensor
    offsets: list[int]

    @property
    def n_nodes(self) -> int:
        """The number of nodes in the batch."""
        return self.offsets[-1]


def flatten_trees(trees: Sequence[BinaryTree], device: torch.device | str = "cpu") -> FlatTrees:
    """Flatten a batch of trees into level-ordered index arrays (see :class:`FlatTrees`).

    Arguments:
        trees: the batch (at least one tree).
        device: where the index tensors go.

    Returns:
        The flattened batch.

    Example:
        >>> from batchfold.data.trees import chain
        >>> flat = flatten_trees([chain(3), BinaryTree.leaf(7)])
        >>> flat.offsets, flat.children.tolist()
        ([0, 4, 5, 6], [0, 1, 4, 2])
    """
    words: list[int] = []  # per node in post-order; -1 on internal nodes
    labels: list[int] = []
    levels: list[int] = []
    left: list[int] = []  # per node; -1 on leaves
    right: list[int] = []
    for tree in trees:
        done: list[int] = []  # finished subtrees' node ids, as a stack
        todo: list[tuple[BinaryTree, bool]] = [(tree, False)]
        while todo:
            node, expanded = todo.pop()
            if node.left is None or node.right is None:
                done.append(len(words))
                words.append(node.word if node.word is not None else -1)
                labels.append(node.label)
                levels.append(0)
                left.append(-1)
                right.append(-1)
            elif expanded:
                r = done.pop()
                lf = done.pop()
                done.append(len(words))
                words.append(-1)
                labels.append(node.label)
                levels.append(max(levels[lf], levels[r]) + 1)
                left.append(lf)
                right.append(r)
            else:
                todo += [(node, True), (node.right, False), (node.left, False)]
    level = np.asarray(levels, dtype=np.int64)
    order = np.argsort(level, kind="stable")  # position -> node id
    position = np.empty_like(order)
    position[order] = np.arange(len(order))  # node id -> position
    counts = np.bincount(level)
    n_leaves = int(counts[0])
    inner = order[n_leaves:]
    children = np.stack(
        [position[np.asarray(left)[inner]], position[np.asarray(right)[inner]]], axis=1
    ).reshape(-1)
    offsets = [0, *np.cumsum(counts).tolist()]
    return FlatTrees(
        words=torch.as_tensor(np.asarray(words)[order[:n_leaves]], device=device),
        labels=torch.as_tensor(np.asarray(labels)[order], device=device),
        children=torch.as_tensor(children, device=device),
        offsets=offsets,
    )


def level_batched_loss(model: TreeLSTMClassifier, trees: Sequence[BinaryTree]) -> Tensor:
    """The summed node loss of a batch of trees, batched by hand level by level.

    All trees are flattened (:func:`flatten_trees`); all leaves run in one cell call, then each
    level runs in one cell call on its children's states, gathered with ``index_select`` from the
    states of the levels below. One output layer call and one cross-entropy cover all nodes.

    Arguments:
        model: the classifier.
        trees: the batch.

    Returns:
        A scalar loss, equal to :func:`naive_batch_loss` up to rounding.

    Example:
        >>> from batchfold.data.trees import random_trees
        >>> _ = torch.manual_seed(0)
        >>> model = TreeLSTMClassifier(1000, emb_dim=8, hidden=4).double()
        >>> trees = random_trees(4, 1, 9, rng=0)
        >>> a, b = level_batched_loss(model, trees), naive_batch_loss(model, trees)
        >>> bool(torch.allclose(a, b, rtol=1e-12))
        True
    """
    cell = model.cell
    hidden = cell.hidden
    flat = flatten_trees(trees, device=model.output.weight.device)
    h, c = cell.leaf(model.embed(flat.words))  # [n_leaves, hidden] each
    hs, cs = [h], [c]
    h_all, c_all = h, c  # states of every node so far, in level order
    off, n_leaves = flat.offsets, flat.offsets[1]
    for k in range(1, len(off) - 1):
        m = off[k + 1] - off[k]  # nodes on level k
        idx = flat.children[2 * (off[k] - n_leaves) : 2 * (off[k + 1] - n_leaves)]  # [2m]
        h_lr = h_all.index_select(0, idx).view(m, 2 * hidden)  # [m, 2 * hidden] = [h_l; h_r]
        c_lr = c_all.index_select(0, idx).view(m, 2, hidden)  # [m, 2, hidden]
        h, c = cell.forward_cat(h_lr, c_lr[:, 0], c_lr[:, 1])
        hs.append(h)
        cs.append(c)
        h_all = torch.cat(hs)
        if k < len(off) - 2:
            c_all = torch.cat(cs)
    return F.cross_entropy(model(h_all), flat.labels, reduction="sum")


@dataclass(frozen=True)
class RoutedTrees:
    """A batch of trees flattened by level, with where each level's states go.

    Nodes are in the level order of :class:`FlatTrees` (the same positions as
    :func:`flatten_trees`): level ``k`` (height above the leaves) holds positions
    ``offsets[k]:offsets[k + 1]``, leaves first. Every node but a root is consumed by its
    parent, on a higher level. Level ``k``'s output rows are routed once: ``routes[k]`` is
    ``(index, sizes, targets)``, and the rows ``index`` selects, split by ``sizes``, are
    pieces for the levels ``targets`` (ascending). ``index`` groups the consumed rows by
    consuming level, each group in level order; it is ``None`` where that is the first
    ``sum(sizes)`` rows as they are. A level whose rows are all roots has no pieces.

    Level ``k >= 1`` concatenates its incoming pieces in arrival order (source levels
    ascending), and ``gathers[k - 1]`` picks its children from that concatenation,
    interleaved ``l0, r0, l1, r1, ...``, ``[2 * m_k]``.

    Arguments:
        words: the word ids of the leaves, ``[n_leaves]`` (int64).
        labels: every node's label in level order, ``[n_nodes]`` (int64).
        offsets: level boundaries, ``[n_levels + 1]``.
        routes: per level, ``(index, sizes, targets)`` as above.
        gathers: per level from 1 up, the children's rows in its incoming pieces.
    """

    words: Tensor
    labels: Tensor
    offsets: list[int]
    routes: list[tuple[Tensor | None, list[int], list[int]]]
    gathers: list[Tensor]

    @property
    def n_nodes(self) -> int:
        """The number of nodes in the batch."""
        return self.offsets[-1]


def _preorder(trees: Sequence[BinaryTree]) -> tuple[list[int], list[int], list[int]]:
    """One pass over the nodes: leaf words, labels and parent codes, by pre-order id.

    A node's parent code is ``2 * parent + side`` (side 0: left child, 1: right) and -1 on
    roots; the leaves' words come in id order.
    """
    words: list[int] = []
    labels: list[int] = []
    parents: list[int] = []
    for tree in trees:
        stack: list[tuple[BinaryTree, int]] = [(tree, -1)]
        while stack:
            node, code = stack.pop()
            i = len(labels)
            labels.append(node.label)
            parents.append(code)
            if node.left is None or node.right is None:
                words.append(node.word if node.word is not None else -1)
            else:
                stack.append((node.right, 2 * i + 1))
                stack.append((node.left, 2 * i))
    return words, labels, parents


def _heights(code: np.ndarray, child: np.ndarray, leaves: np.ndarray) -> np.ndarray:
    """Every node's height above the leaves, a level at a time from the leaves up.

    Arguments:
        code: each node's parent code (``2 * parent + side``; -1 on roots), ``[n]``.
        child: each node's children, flat: ``child[2 * i + side]`` (-1 on leaves), ``[2n]``.
        leaves: the leaves' ids.

    Returns:
        ``[n]`` (int64). The work is linear in the number of nodes, plus a few NumPy calls per
        level.
    """
    height = np.full(len(code), -1, dtype=np.int64)
    height[leaves] = 0
    frontier, k = leaves, 0
    while True:
        up = code[frontier]
        up = up[up >= 0]
        sibling = height[child[up ^ 1]]
        # A parent is done with the last of its children; when both finish on this level,
        # the right one lifts it.
        up = up[(sibling >= 0) & ((sibling < k) | (up & 1 == 1))] >> 1
        if up.size == 0:
            return height
        k += 1
        height[up] = k
        frontier = up


def route_trees(trees: Sequence[BinaryTree], device: torch.device | str = "cpu") -> RoutedTrees:
    """Flatten a batch of trees by level and plan the routing of every level's states.

    One Python pass over the nodes (:func:`_preorder`); the rest is vectorised NumPy, and all
    index tensors go to ``device`` as one array (see :class:`RoutedTrees`).

    Arguments:
        trees: the batch (at least one tree).
        device: where the index tensors go.

    Returns:
        The flattened batch and its routing.

    Example:
        >>> from batchfold.data.trees import chain
        >>> plan = route_trees([BinaryTree.leaf(7), chain(3)])
        >>> plan.offsets, [(sizes, targets) for _, sizes, targets in plan.routes]
        ([0, 4, 5, 6], [([2, 1], [1, 2]), ([1], [2]), ([], [])])
        >>> plan.routes[0][0].tolist(), [g.tolist() for g in plan.gathers]
        ([1, 2, 3], [[0, 1], [1, 0]])
    """
    words, labels, codes = _preorder(trees)
    code = np.asarray(codes, dtype=np.int64)
    n = len(code)
    nonroot = np.flatnonzero(code >= 0)
    parent = np.full(n, -1, dtype=np.int64)
    parent[nonroot] = code[nonroot] >> 1
    child = np.full(2 * n, -1, dtype=np.int64)
    child[code[nonroot]] = nonroot
    leaves = np.flatnonzero(child[::2] < 0)
    height = _heights(code, child, leaves)
    child = child.reshape(n, 2)
    order = np.argsort(height, kind="stable")  # position -> id
    position = np.empty_like(order)
    position[order] = np.arange(n)  # id -> position
    counts = np.bincount(height)
    n_levels = len(counts)
    offsets = np.concatenate([[0], np.cumsum(counts)])

    # The consumed positions (ascending), their levels and their parents' levels.
    up = parent[order]
    routed = np.flatnonzero(up >= 0)
    src = height[order[routed]]
    dst = height[up[routed]]
    # Routing: each level's consumed rows grouped by consuming level, in level order within.
    key = src * n_levels + dst
    by_key = np.argsort(key, kind="stable")
    route_rows = routed[by_key] - offsets[src[by_key]]
    pieces = np.bincount(key, minlength=n_levels * n_levels).reshape(n_levels, n_levels)
    # A consuming level's incoming pieces, concatenated by source level, hold its consumed
    # positions in ascending order: a position's row there is its rank among them.
    by_dst = np.argsort(dst, kind="stable")
    received = np.bincount(dst, minlength=n_levels)
    first = np.concatenate([[0], np.cumsum(received)[:-1]])
    rank = np.empty(n, dtype=np.int64)
    rank[routed[by_dst]] = np.arange(len(routed)) - first[dst[by_dst]]
    gather = rank[position[child[order[counts[0] :]]]].reshape(-1)  # l0, r0, l1, r1, ...

    n_leaves = int(counts[0])
    # The leaves take positions 0..n_leaves-1 in id order, the order of ``words``.
    parts = [np.asarray(words, dtype=np.int64), np.asarray(labels)[order], route_rows, gather]
    flat = torch.as_tensor(np.concatenate(parts), device=device)  # one transfer
    words_t, labels_t, rows_t, gather_t = flat.split([n_leaves, n, len(route_rows), len(gather)])
    routes: list[tuple[Tensor | None, list[int], list[int]]] = []
    start = 0
    for row in pieces.tolist():
        targets = [k for k, size in enumerate(row) if size]
        sizes = [row[k] for k in targets]
        total = sum(sizes)
        rows = route_rows[start : start + total]
        identity = bool((rows == np.arange(total)).all())
        routes.append((None if identity else rows_t[start : start + total], sizes, targets))
        start += total
    bounds = (2 * (offsets - n_leaves)).tolist()
    gathers = [gather_t[bounds[k] : bounds[k + 1]] for k in range(1, n_levels)]
    return RoutedTrees(words_t, labels_t, offsets.tolist(), routes, gathers)


def routed_loss(model: TreeLSTMClassifier, plan: RoutedTrees) -> Tensor:
    """The summed node loss of a batch flattened and routed by :func:`route_trees`.

    All leaves run in one leaf-cell call. Each level's ``h`` and ``c`` are routed once, one
    ``index_select`` and a ``split`` each, into pieces for the levels that consume them; each
    internal level concatenates its incoming pieces, gathers ``[h_l; h_r]`` and ``c_l, c_r``
    with one ``index_select`` each and runs the cell once. One output layer call and one
    cross-entropy cover all nodes. Nothing is concatenated twice, so the forward and the
    backward pass are linear in the number of nodes.

    Arguments:
        model: the classifier.
        plan: the batch.

    Returns:
        A scalar loss.
    """
    cell = model.cell
    hidden = cell.hidden
    h, c = cell.leaf(model.embed(plan.words))  # [n_leaves, hidden] each
    hs = [h]
    inbox: list[list[tuple[Tensor, Tensor]]] = [[] for _ in plan.routes]
    for k, (index, sizes, targets) in enumerate(plan.routes):
        if k:
            pieces = inbox[k]
            inbox[k] = []
            if len(pieces) == 1:
                h_in, c_in = pieces[0]
            else:
                h_in = torch.cat([p[0] for p in pieces])
                c_in = torch.cat([p[1] for p in pieces])
            idx = plan.gathers[k - 1]
            m = idx.shape[0] // 2
            h_lr = h_in.index_select(0, idx).view(m, 2 * hidden)  # [h_l; h_r]
            c_lr = c_in.index_select(0, idx).view(m, 2, hidden)
            h, c = cell.forward_cat(h_lr, c_lr[:, 0], c_lr[:, 1])
            hs.append(h)
        if not sizes:
            continue
        if index is not None:
            h_out, c_out = h.index_select(0, index), c.index_select(0, index)
        else:
            total = sum(sizes)
            h_out, c_out = (h, c) if total == h.shape[0] else (h[:total], c[:total])
        for target, h_piece, c_piece in zip(
            targets, h_out.split(sizes), c_out.split(sizes), strict=True
        ):
            inbox[target].append((h_piece, c_piece))
    return F.cross_entropy(model(torch.cat(hs)), plan.labels, reduction="sum")


def routed_level_batched_loss(model: TreeLSTMClassifier, trees: Sequence[BinaryTree]) -> Tensor:
    """The summed node loss of a batch of trees, batched by level with routed states.

    :func:`route_trees` then :func:`routed_loss`: the hand-written level batching of
    :func:`level_batched_loss` without its re-concatenation of every level's states at each
    level. The flattening and index building are part of the call, as they are part of
    hand-written batching's cost.

    Arguments:
        model: the classifier.
        trees: the batch.

    Returns:
        A scalar loss, equal to :func:`naive_batch_loss` up to rounding.

    Example:
        >>> from batchfold.data.trees import random_trees
        >>> _ = torch.manual_seed(0)
        >>> model = TreeLSTMClassifier(1000, emb_dim=8, hidden=4).double()
        >>> trees = random_trees(4, 1, 9, rng=0)
        >>> a, b = routed_level_batched_loss(model, trees), naive_batch_loss(model, trees)
        >>> bool(torch.allclose(a, b, rtol=1e-12))
        True
    """
    return routed_loss(model, route_trees(trees, device=model.output.weight.device))


def tree_lstm_baselines(model: TreeLSTMClassifier) -> dict[str, Runner]:
    """The baseline runners for a Tree-LSTM classifier.

    Arguments:
        model: the classifier every runner uses.

    Returns:
        ``{"naive": ..., "level-batched": ..., "routed": ...}``: :func:`naive_batch_loss`,
        :func:`level_batched_loss` and :func:`routed_level_batched_loss` bound to ``model``.
    """
    return {
        "naive": partial(naive_batch_loss, model),
        "level-batched": partial(level_batched_loss, model),
        "routed": partial(routed_level_batched_loss, model),
    }


def main(argv: Sequence[str] | None = None) -> None:
    """Print training (and optionally inference) trees/s of the baselines per batch size."""
    parser = argparse.ArgumentParser(
        description="Time the naive and level-batched Tree-LSTM baselines."
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 32, 256])
    parser.add_argument("--min-leaves", type=int, default=2)
    parser.add_argument("--max-leaves", type=int, default=60)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--emb", type=int, default=300)
    parser.add_argument("--hidden", type=int, default=150)
    parser.add_argument("--inference", action="store_true", help="also time inference")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = TreeLSTMClassifier(args.vocab, args.emb, args.hidden, n_classes=5)
    # The loss is a sum over ~15,000 nodes at batch size 256: a small rate keeps the weights sane.
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    runners = tree_lstm_baselines(model)
    print(
        f"Tree-LSTM, random trees with {args.min_leaves}-{args.max_leaves} leaves, "
        f"embedding {args.emb}, hidden {args.hidden}, {torch.get_num_threads()} threads"
    )
    print(f"{'mode':<10} {'batch':>5} " + " ".join(f"{name:>14}" for name in runners))
    modes = ["training", "inference"] if args.inference else ["training"]
    for mode in modes:
        for batch_size in args.batch_sizes:
            # About the same number of trees per measurement at every batch size.
            repeats = max(3, min(30, 256 // batch_size))
            batches = make_batches(
                repeats + 1, batch_size, args.min_leaves, args.max_leaves, args.vocab, seed=1
            )
            rates = []
            for runner in runners.values():
                if mode == "training":
                    timing = time_training(runner, batches, optimizer, repeats=repeats)
                else:
                    timing = time_inference(runner, batches, repeats=repeats)
                rates.append(timing.trees_per_s)
            print(f"{mode:<10} {batch_size:>5} " + " ".join(f"{r:>14.1f}" for r in rates))


if __name__ == "__main__":
    main()
