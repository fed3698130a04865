"""The graph: an append-only record of per-instance operation nodes, waiting to run.

Front ends call :meth:`Graph.add` once per operation per instance. Nodes with the same
:class:`Signature` (the op, its shared arguments by identity, the shapes and dtypes of its
per-instance inputs, and its constants) may run as one batched call. ``schedule`` turns the
pending nodes into a ``Plan``; once it has run, the graph starts a new pending segment.

A *value* is one tensor output of one node; its id is ``node << OUT_BITS | output``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .signature import MIXED_GRAD, NEEDS_GRAD, NO_GRAD, Pending, Signature, Slot, TensorMeta

__all__ = ["OUT_BITS", "OUT_MASK", "Graph", "Pending", "Signature", "Slot", "TensorMeta"]

OUT_BITS = 16  # a node has at most 2**16 outputs
OUT_MASK = (1 << OUT_BITS) - 1


class Graph:
    """Per-instance op nodes for one batch, numbered in recording order.

    Every node's inputs come before it, so the graph is acyclic by construction. After a
    segment runs (:meth:`clear_pending`), its values stay addressable by later nodes.

    Example:
        >>> import torch
        >>> g = Graph()
        >>> meta = TensorMeta.of((3,), torch.float32, torch.device("cpu"))
        >>> src = g.signature("c", func=torch.zeros, rule=None, name="zeros", out_metas=(meta,))
        >>> v = g.add(src, (), instance=0, payload=torch.zeros(3))
        >>> neg = g.signature("n", func=torch.neg, rule=None, name="neg", in_metas=(meta,),
        ...                   out_metas=(meta,))
        >>> g.add(neg, (v,), instance=0) >> OUT_BITS
        1
        >>> g.lint(); print(g)
        node 0  zeros() -> float32[3]  depth 0  instance 0
        node 1  neg(v0.0) -> float32[3]  depth 1  instance 0
    """

    def __init__(self) -> None:
        self.signatures: list[Signature] = []
        self.pending_of: list[Pending] = []  # per signature id, its nodes waiting to run
        self._by_key: dict[Any, Signature] = {}
        self.families: dict[Any, Any] = {}  # family key -> ragged.Family
        self.node_base = 0  # nodes below this have been run
        self.node_depth: list[int] = []  # depth of each pending node (index node - node_base)
        self.touched: list[int] = []  # the pending buffers holding nodes, in first-use order
        self.views: set[int] = set()  # signatures whose outputs may view their first input
        self.kept = 0  # signatures below this id were kept from earlier runs
        self.operands: dict[Any, Any] = {}  # numbers seen per op (lazy.sources.operand)
        # the values eager PyTorch would give ``requires_grad=False`` (see Signature.grad_rule),
        # of this run's segments: a value handed to the user is detached when it is one
        self.grad_free: set[int] = set()
        self.macros: dict[Any, Any] = {}  # ragged macros kept with it (lazy.ragged_macros)
        self._weakly_kept: list[Signature] = []  # kept signatures whose keep is a weak reference
        self._arrays: tuple[list[int], list[int], list[int]] = ([], [], [])

    def lookup(self, key: Any) -> Signature | None:
        """The signature with exactly this key, if one was made."""
        return self._by_key.get(key)

    def signature(self, key: Any, **fields: Any) -> Signature:
        """Make and register a new signature (callers check :meth:`lookup` first).

        ``fields`` are :class:`Signature`'s keyword arguments (``func``, ``rule``, ``name``,
        ``template``, ``in_metas``, ``out_metas``, ``multi``, ``site``, ``source``, ``ref``).
        """
        sig = Signature(len(self.signatures), key, **fields)
        self.signatures.append(sig)
        self.pending_of.append(Pending())
        self._by_key[key] = sig
        return sig

    def add(
        self,
        sig: Signature,
        inputs: list[int] | tuple[int, ...],
        instance: int,
        payload: Any = None,
    ) -> int:
        """Record one node of ``sig`` reading value ids ``inputs``; returns its first value id."""
        depths, base = self.node_depth, self.node_base
        depth = 0
        for v in inputs:
            producer = (v >> OUT_BITS) - base
            if producer >= 0 and depths[producer] >= depth:  # computed values count as depth -1
                depth = depths[producer] + 1
        node = base + len(depths)
        depths.append(depth)
        pending = self.pending_of[sig.pool]
        if not pending.nodes:
            self.touched.append(sig.pool)
        pending.nodes.append(node)
        pending.inputs.extend(inputs)
        pending.instances.append(instance)
        if payload is not None:
            pending.payloads.append(payload)
        if sig.family is not None:
            pending.members.append(sig.id)
        first = node << OUT_BITS
        if sig.grad_rule != NEEDS_GRAD or sig.int_outs:
            self.note_grad_free(sig, inputs, first)
        return first

    def note_grad_free(
        self, sig: Signature, inputs: list[int] | tuple[int, ...], first: int
    ) -> None:
        """Add the outputs of a node of ``sig`` (its first value id ``first``) reading
        ``inputs`` that eager PyTorch gives ``requires_grad=False`` to :attr:`grad_free`."""
        rule = sig.grad_rule
        if rule == MIXED_GRAD:
            free = self.grad_free
            for o, (needs, reads) in enumerate(sig.out_grad):
                if not needs and all(inputs[k] in free for k in reads):
                    free.add(first + o)
        elif rule != NEEDS_GRAD and (rule == NO_GRAD or self.grad_free.issuperset(inputs)):
            if len(sig.out_metas) == 1:
                self.grad_free.add(first)
            else:
                self.grad_free.update(range(first, first + len(sig.out_metas)))
        elif sig.int_outs:
            self.grad_free.update(first + o for o in sig.int_outs)

    def add_source(self, sig: Signature, instance: int, payload: Any) -> int:
        """:meth:`add` of a node with no inputs, a payload and one output that needs no
        gradient (a per-instance number's source, the commonest node): its value id."""
        depths = self.node_depth
        node = self.node_base + len(depths)
        depths.append(0)
        pending = self.pending_of[sig.pool]
        if not pending.nodes:
            self.touched.append(sig.pool)
        pending.nodes.append(node)
        pending.instances.append(instance)
        pending.payloads.append(payload)
        if sig.family is not None:
            pending.members.append(sig.id)
        first = node << OUT_BITS
        self.grad_free.add(first)
        return first

    @property
    def pending(self) -> int:
        """Number of nodes recorded and not yet run."""
        return len(self.node_depth)

    def pending_arrays(self) -> tuple[np.ndarray, np.ndarray, dict[int, np.ndarray]]:
        """Buffer and depth of every pending node, and each buffer's pending nodes.

        A node's buffer is its signature's, or for a ragged family's member, the first
        member's (see :meth:`node_signatures`). Nodes are numbered from the segment's first
        node (``node - node_base``); all arrays are int64.
        """
        sig_of = np.zeros(len(self.node_depth), dtype=np.int64)
        members = {}
        for sig_id in sorted(self.touched):
            nodes = self.pending_of[sig_id].nodes
            local = members[sig_id] = np.asarray(nodes, dtype=np.int64) - self.node_base
            sig_of[local] = sig_id
        return sig_of, np.asarray(self.node_depth, dtype=np.int64), members

    def node_signatures(self, sig_of: np.ndarray, members: dict[int, np.ndarray]) -> np.ndarray:
        """Each pending node's own signature, from :meth:`pending_arrays`' first and last."""
        own = sig_of
        for sig_id, local in members.items():
            pool = self.pending_of[sig_id].members
            if pool:
                own = sig_of.copy() if own is sig_of else own
                own[local] = pool
        return own

    def clear_pending(self) -> None:
        """Start a new segment: everything recorded so far has been run."""
        self.node_base += len(self.node_depth)
        self.node_depth = []
        for pool in self.touched:
            self.pending_of[pool] = Pending()
        self.touched = []

    def signature_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each signature's number of inputs, whether its rule is expensive (not ``cheap``),
        and its ragged length, for the scheduler; kept up to date as signatures are made."""
        widths, expensive, lengths = self._arrays
        for sig in self.signatures[len(widths) :]:
            widths.append(len(sig.in_metas))
            expensive.append(0 if sig.rule is None or sig.rule.cheap else 1)
            lengths.append(sig.length)
        return (
            np.asarray(widths, dtype=np.int64),
            np.asarray(expensive, dtype=np.int64),
            np.asarray(lengths, dtype=np.int64),
        )

    def retire(self) -> None:
        """End a run: forget its nodes and the signatures made in it that cannot serve another.

        A signature whose ``keep`` is ``True`` (its key holds no object by identity, its
        template no tensor from outside: an op on lazy values, a source) stays, with its
        family, so that the next run on this graph finds it instead of making it again (output
        shapes, family joins, the site); one whose ``keep`` is a weak reference (a kept module
        call's member) stays while the reference lives, and once one has died, every kept
        signature is gone through again. The others are dropped, and those kept renumbered
        after the ones kept before. A kept signature's pool and family are kept with it: both
        are made with it or before it, from a key that holds what its own does.
        """
        start = self.kept
        if any(sig.keep() is None for sig in self._weakly_kept):
            start = 0  # one kept by a weak reference has lost it: go through all of them
        new = self.signatures[start:]
        survivors: dict[int, int] = {}
        for sig in new:
            keep = sig.keep  # True, or a weak reference: kept while its referent lives
            if keep is not True and not (keep and keep() is not None):
                continue
            if sig.pool < start or sig.pool == sig.id or sig.pool in survivors:
                survivors[sig.id] = start + len(survivors)
        for sig in new:
            if sig.id in survivors:
                sig.pool = survivors.get(sig.pool, sig.pool)
            elif self._by_key.get(sig.key) is sig:
                del self._by_key[sig.key]
        kept_families: dict[int, bool] = {}  # a family may be under two keys: decide once
        for fkey, family in list(self.families.items()):
            keep = kept_families.get(id(family))
            if keep is None:
                keep = kept_families[id(family)] = family.rep < start or family.rep in survivors
                family.rep = survivors.get(family.rep, family.rep)
            if not keep:
                del self.families[fkey]
        self.views = {survivors.get(v, v) for v in self.views if v < start or v in survivors}
        kept = [sig for sig in new if sig.id in survivors]
        for sig in kept:
            sig.id = survivors[sig.id]
        self.signatures = self.signatures[:start] + kept
        for pool in self.touched:  # a run that failed leaves nodes behind
            if pool < start:
                self.pending_of[pool] = Pending()
        self.pending_of = self.pending_of[:start] + [Pending() for _ in kept]
        self.node_base, self.node_depth, self.touched = 0, [], []
        self.grad_free = set()
        self.kept = len(self.signatures)
        self._arrays = tuple(a[:start] for a in self._arrays)  # type: ignore[assignment]
        self._weakly_kept = [sig for sig in self.signatures if sig.keep is not True]

    def release(self) -> None:
        """Forget every signature and pending node (see ``Recorder.release``)."""
        self.signatures, self.pending_of, self.node_depth = [], [], []
        self.families, self._by_key, self.touched, self.views = {}, {}, [], set()
        self.kept, self._arrays, self.operands, self.macros = 0, ([], [], []), {}, {}
        self._weakly_kept, self.grad_free = [], set()

    def lint(self) -> None:
        """Check the pending segment's invariants; raise :class:`GraphError` on a broken graph.

        Every signature has one row of ``len(in_metas)`` inputs and one instance per pending
        node (and one payload each, if any); pending nodes are numbered ``node_base`` up,
        each in exactly one signature; a node reads only values of earlier nodes, and a
        pending producer's value exists and has the meta the reader expects; each node's depth
        is one more than its deepest pending producer's (0 with none). The checks are real
        ``raise`` statements, so they also run under ``python -O``.

        Raises:
            GraphError: the first broken invariant, naming the signature, where it was
                recorded, and the node.

        Example:
            >>> import torch
            >>> g = Graph()
            >>> meta = TensorMeta.of((3,), torch.float32, torch.device("cpu"))
            >>> src = g.signature("c", func=torch.zeros, rule=None, name="zeros",
            ...                   out_metas=(meta,), site="a.py:1")
            >>> neg = g.signature("n", func=torch.neg, rule=None, name="neg", in_metas=(meta,),
            ...                   out_metas=(meta,), site="a.py:2")
            >>> w = g.add(neg, (g.add(src, (), instance=0),), instance=0)
            >>> g.lint()  # a well-formed graph: nothing happens
            >>> g.pending_of[neg.id].inputs[0] = w  # broken by hand: node 1 now reads its own output
            >>> g.lint()
            Traceback (most recent call last):
              ...
            batchfold.errors.GraphError: Signature(1, neg(float32[3]) -> float32[3]) (recorded at a.py:2): node 1 reads v1.0, a value of node 1, which is not an earlier node
        """
        from .errors import GraphError

        base, count = self.node_base, len(self.node_depth)
        owner: list[Signature | None] = [None] * count  # the signature of each pending node
        row: list[int] = [0] * count  # each pending node's position in its signature

        def fail(sig: Signature, message: str) -> GraphError:
            return GraphError(f"{sig} (recorded at {sig.site or 'an unknown site'}): {message}")

        pool_of: list[Signature | None] = [None] * count  # the buffer of each pending node
        for sig, pending in zip(self.signatures, self.pending_of, strict=True):
            n, width = len(pending.nodes), len(sig.in_metas)
            if pending.members and len(pending.members) != n:
                raise fail(sig, f"{len(pending.members)} member signatures for {n} nodes")
            if len(pending.inputs) != width * n:
                raise fail(sig, f"{len(pending.inputs)} input value ids for {n} nodes of {width}")
            if len(pending.instances) != n:
                raise fail(sig, f"{len(pending.instances)} instance ids for {n} nodes")
            if pending.payloads and len(pending.payloads) != n:
                raise fail(sig, f"{len(pending.payloads)} payloads for {n} nodes")
            for i, node in enumerate(pending.nodes):
                if not base <= node < base + count:
                    raise fail(
                        sig, f"node {node} is not pending (pending: {base}..{base + count - 1})"
                    )
                other = owner[node - base]
                if other is not None:
                    raise fail(sig, f"node {node} also belongs to {other}")
                member = self.signatures[pending.members[i]] if pending.members else sig
                if member.pool != sig.id:
                    raise fail(sig, f"node {node} of {member} is in the buffer of {sig}")
                owner[node - base], row[node - base] = member, i
                pool_of[node - base] = sig
                if pending.instances[i] < 0:
                    raise fail(sig, f"node {node} has instance {pending.instances[i]}")
        for local, sig in enumerate(owner):
            if sig is None:
                raise GraphError(f"pending node {base + local} belongs to no signature")
            node, width = base + local, len(sig.in_metas)
            depth = 0
            pool = pool_of[local]
            assert pool is not None
            reads = self.pending_of[pool.id].inputs[row[local] * width : (row[local] + 1) * width]
            for j, v in enumerate(reads):
                producer, out = v >> OUT_BITS, v & OUT_MASK
                if v < 0 or producer >= node:
                    raise fail(
                        sig,
                        f"node {node} reads v{producer}.{out}, a value of node {producer}, "
                        "which is not an earlier node",
                    )
                if producer < base:
                    continue  # computed in an earlier segment
                made_by = owner[producer - base]
                if made_by is None:  # an earlier pending node: already raised above
                    raise GraphError(f"pending node {producer} belongs to no signature")
                if out >= len(made_by.out_metas):
                    raise fail(
                        sig,
                        f"node {node} reads v{producer}.{out}, but {made_by} has "
                        f"{len(made_by.out_metas)} output(s)",
                    )
                if made_by.out_metas[out] is not sig.in_metas[j]:
                    raise fail(
                        sig,
                        f"node {node} input {j} expects {sig.in_metas[j]!r}, but v{producer}.{out} "
                        f"of {made_by} is {made_by.out_metas[out]!r}",
                    )
                depth = max(depth, self.node_depth[producer - base] + 1)
            if self.node_depth[local] != depth:
                raise fail(
                    sig, f"node {node} has depth {self.node_depth[local]}, its inputs give {depth}"
                )

    def __str__(self) -> str:
        lines = []
        for pool, pending in zip(self.signatures, self.pending_of, strict=True):
            width = len(pool.in_metas)
            for i, node in enumerate(pending.nodes):
                sig = self.signatures[pending.members[i]] if pending.members else pool
                outs = ", ".join(map(repr, sig.out_metas))
                args = ", ".join(
                    f"v{v >> OUT_BITS}.{v & OUT_MASK}"
                    for v in pending.inputs[i * width : (i + 1) * width]
                )
                depth = self.node_depth[node - self.node_base]
                lines.append(
                    (
                        node,
                        f"node {node}  {sig.name}({args}) -> {outs}  "
                        f"depth {depth}  instance {pending.instances[i]}",
                    )
                )
        return "\n".join(line for _, line in sorted(lines))
