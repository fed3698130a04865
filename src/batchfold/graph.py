"""The graph: an append-only record of per-instance operation nodes, waiting to run.

Front ends call :meth:`Graph.add` once per operation per instance. Nodes with the same
:class:`Signature` (the op, its shared arguments by identity, the shapes and dtypes of its
per-instance inputs, and its constants) may run as one batched call. ``schedule`` turns the
pending nodes into a ``Plan``; once it has run, the graph starts a new pending segment.

A *value* is one tensor output of one node; its id is ``node << OUT_BITS | output``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import torch

OUT_BITS = 16  # a node has at most 2**16 outputs
OUT_MASK = (1 << OUT_BITS) - 1


class TensorMeta:
    """Shape, dtype and device of one per-instance value (no batch dimension).

    Instances are interned (:meth:`of`), so equal metas are the same object and compare and
    hash by identity, which keeps signature lookups cheap.
    """

    __slots__ = ("shape", "dtype", "device", "size", "__weakref__")
    _interned: ClassVar[dict[tuple[Any, ...], TensorMeta]] = {}

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
        self.shape, self.dtype, self.device = shape, dtype, device
        self.size = torch.Size(shape)

    @classmethod
    def of(cls, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> TensorMeta:
        """The one ``TensorMeta`` with these fields."""
        key = (shape, dtype, device)
        meta = cls._interned.get(key)
        if meta is None:
            meta = cls._interned[key] = cls(shape, dtype, device)
        return meta

    def __reduce__(self) -> tuple[Any, ...]:
        return (TensorMeta.of, (self.shape, self.dtype, self.device))

    def __repr__(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        return f"{dtype}[{', '.join(map(str, self.shape))}]"


class Slot:
    """Marks where the ``index``-th per-instance input goes in a signature's argument template."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"Slot({self.index})"


class Signature:
    """What a set of nodes share so that they may run as one batched call.

    ``key`` is compared in full (never by hash alone). ``template`` holds the call's arguments
    with a :class:`Slot` for every per-instance input. ``nodes``, ``inputs`` (one row of
    ``len(in_metas)`` value ids per node), ``instances`` and ``payloads`` (per-node data of
    source nodes, which have no inputs) list this signature's pending nodes.
    """

    __slots__ = (
        "id",
        "key",
        "func",
        "rule",
        "name",
        "template",
        "in_metas",
        "out_metas",
        "multi",
        "site",
        "nodes",
        "inputs",
        "instances",
        "payloads",
    )

    def __init__(
        self,
        id: int,
        key: Any,
        func: Callable[..., Any],
        rule: Any,
        name: str,
        template: tuple[Any, Any],
        in_metas: tuple[TensorMeta, ...],
        out_metas: tuple[TensorMeta, ...],
        multi: type | None,
        site: str,
    ) -> None:
        self.id, self.key, self.func, self.rule, self.name = id, key, func, rule, name
        self.template = template
        self.in_metas, self.out_metas = in_metas, out_metas
        self.multi = multi  # None: one tensor out; else the tuple type the op returns
        self.site = site  # file:line where the first node of this signature was recorded
        self.nodes: list[int] = []
        self.inputs: list[int] = []
        self.instances: list[int] = []
        self.payloads: list[Any] = []

    def __repr__(self) -> str:
        ins = ", ".join(map(repr, self.in_metas))
        outs = ", ".join(map(repr, self.out_metas))
        return f"Signature({self.id}, {self.name}({ins}) -> {outs})"


class Graph:
    """Per-instance op nodes for one batch, numbered in recording order.

    Every node's inputs come before it, so the graph is acyclic by construction. After a
    segment runs (:meth:`clear_pending`), its values stay addressable by later nodes.

    Example:
        >>> import torch
        >>> g = Graph()
        >>> meta = TensorMeta.of((3,), torch.float32, torch.device("cpu"))
        >>> src = g.signature("c", torch.zeros, None, "zeros", ((), {}), (), (meta,), None, "")
        >>> v = g.add(src, (), instance=0, payload=torch.zeros(3))
        >>> neg = g.signature("n", torch.neg, None, "neg", ((), {}), (meta,), (meta,), None, "")
        >>> g.add(neg, (v,), instance=0) >> OUT_BITS
        1
        >>> g.lint(); print(g)
        node 0  zeros() -> float32[3]  depth 0  instance 0
        node 1  neg(v0.0) -> float32[3]  depth 1  instance 0
    """

    def __init__(self) -> None:
        self.signatures: list[Signature] = []
        self._by_key: dict[Any, Signature] = {}
        self.node_base = 0  # nodes below this have been run
        self.node_depth: list[int] = []  # depth of each pending node (index node - node_base)

    def lookup(self, key: Any) -> Signature | None:
        """The signature with exactly this key, if one was made."""
        return self._by_key.get(key)

    def signature(
        self,
        key: Any,
        func: Callable[..., Any],
        rule: Any,
        name: str,
        template: tuple[Any, Any],
        in_metas: tuple[TensorMeta, ...],
        out_metas: tuple[TensorMeta, ...],
        multi: type | None,
        site: str,
    ) -> Signature:
        """Make and register a new signature (callers check :meth:`lookup` first)."""
        sig = Signature(
            len(self.signatures), key, func, rule, name, template, in_metas, out_metas, multi, site
        )
        self.signatures.append(sig)
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
        sig.nodes.append(node)
        sig.inputs.extend(inputs)
        sig.instances.append(instance)
        if payload is not None:
            sig.payloads.append(payload)
        return node << OUT_BITS

    @property
    def pending(self) -> int:
        """Number of nodes recorded and not yet run."""
        return len(self.node_depth)

    def pending_arrays(self) -> tuple[np.ndarray, np.ndarray, dict[int, np.ndarray]]:
        """Signature id and depth of every pending node, and each signature's pending nodes.

        Nodes are numbered from the segment's first node (``node - node_base``); all arrays
        are int64.
        """
        sig_of = np.zeros(len(self.node_depth), dtype=np.int64)
        members = {}
        for sig in self.signatures:
            if sig.nodes:
                local = members[sig.id] = np.asarray(sig.nodes, dtype=np.int64) - self.node_base
                sig_of[local] = sig.id
        return sig_of, np.asarray(self.node_depth, dtype=np.int64), members

    def clear_pending(self) -> None:
        """Start a new segment: everything recorded so far has been run."""
        self.node_base += len(self.node_depth)
        self.node_depth = []
        for sig in self.signatures:
            sig.nodes, sig.inputs, sig.instances, sig.payloads = [], [], [], []

    def lint(self) -> None:
        """Check the graph's invariants; raises ``AssertionError`` on a broken graph."""
        seen = 0
        for sig in self.signatures:
            width = len(sig.in_metas)
            assert len(sig.inputs) == width * len(sig.nodes), f"{sig}: inputs do not match nodes"
            assert len(sig.instances) == len(sig.nodes), f"{sig}: instances do not match nodes"
            assert not sig.payloads or len(sig.payloads) == len(sig.nodes)
            for i, node in enumerate(sig.nodes):
                for v in sig.inputs[i * width : (i + 1) * width]:
                    assert v >> OUT_BITS < node, f"node {node} reads value {v} of a later node"
                    assert v & OUT_MASK < 1 << OUT_BITS
            seen += len(sig.nodes)
        assert seen == len(self.node_depth), "a pending node belongs to no signature"

    def __str__(self) -> str:
        lines = []
        for sig in self.signatures:
            width = len(sig.in_metas)
            outs = ", ".join(map(repr, sig.out_metas))
            for i, node in enumerate(sig.nodes):
                args = ", ".join(
                    f"v{v >> OUT_BITS}.{v & OUT_MASK}"
                    for v in sig.inputs[i * width : (i + 1) * width]
                )
                depth = self.node_depth[node - self.node_base]
                lines.append(
                    (
                        node,
                        f"node {node}  {sig.name}({args}) -> {outs}  "
                        f"depth {depth}  instance {sig.instances[i]}",
                    )
                )
        return "\n".join(line for _, line in sorted(lines))
