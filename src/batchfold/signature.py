"""What the nodes of a graph share: their per-instance value metas and their signature.

:class:`TensorMeta` is one per-instance value's shape, dtype and device; :class:`Signature`
is what a set of nodes share so that they may run as one batched call; :class:`Pending` holds
one signature's nodes waiting to run. :mod:`batchfold.graph` records nodes with them.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, ClassVar

import torch

NO_GRAD = 0
"""A signature's :attr:`~Signature.grad_rule`: its outputs never require grad (made outside
grad mode, of an integer dtype, or by an op with no gradient such as ``zeros_like``)."""
INHERITS_GRAD = 1
"""Its outputs require grad when one of the node's inputs does, as eager PyTorch decides."""
NEEDS_GRAD = 2
"""Its outputs may require grad whatever the inputs (the op reads a weight that requires grad,
or what it runs is not known); the rule of every signature no front end says more of."""
MIXED_GRAD = 3
"""Each output has a rule of its own, :attr:`Signature.out_grad` (a cached module call whose
outputs differ: one reads a weight, another only some of the call's inputs)."""


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
        if meta is None:  # setdefault: two threads interning one key get one object
            meta = cls._interned.setdefault(key, cls(shape, dtype, device))
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
    with a :class:`Slot` for every per-instance input. ``source`` is ``None`` for an op, and
    for a node with no inputs whose value is its payload, how the payloads make a batch:
    ``"scalar"`` (Python numbers), ``"tensor"`` (tensors to stack) or ``"constant"`` (one
    tensor every instance reads, such as a parameter: stacked like ``"tensor"``, but left out
    when a plan is pickled; the front end that binds the plan supplies it). ``ref``, when
    set, names the signature in a way that survives pickling: a pickled plan's steps keep
    only ``ref``, and the front end that made them binds them to its ops again (blocks: the
    op's index in the compiled model). ``None`` means the signature holds live state, such as
    per-instance code's modules, and a plan holding it runs only where it was made. ``grad``
    is the grad mode its nodes were recorded in (0 no grad, 1 grad; ``None``: the caller's),
    and ``shared`` the outside tensors its template reads, each with the version it had then.
    ``grad_rule`` says when eager PyTorch's outputs would require grad (:data:`NO_GRAD`,
    :data:`INHERITS_GRAD`, :data:`NEEDS_GRAD` or :data:`MIXED_GRAD` with ``out_grad``), and
    ``int_outs`` which outputs never can.
    The nodes waiting to run are not kept here but in the graph's :class:`Pending` buffers.
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
        "source",
        "grad",
        "grad_rule",
        "out_grad",
        "int_outs",
        "shared",
        "derived",
        "family",
        "length",
        "pool",
        "ref",
        "keep",
    )

    def __init__(
        self,
        id: int,
        key: Any,
        *,
        func: Callable[..., Any],
        rule: Any,
        name: str,
        template: tuple[Any, Any] = ((), {}),
        in_metas: tuple[TensorMeta, ...] = (),
        out_metas: tuple[TensorMeta, ...],
        multi: type | None = None,
        site: str = "",
        source: str | None = None,
        ref: Any = None,
    ) -> None:
        self.id, self.key, self.func, self.rule, self.name = id, key, func, rule, name
        self.template = template
        self.in_metas, self.out_metas = in_metas, out_metas
        self.multi = multi  # None: one tensor out; else the tuple type the op returns
        self.site = site  # file:line where the first node of this signature was recorded
        self.source = source
        self.grad: int | None = None
        # outputs of a dtype without gradients (indices, masks), by position
        self.int_outs = tuple(
            i
            for i, m in enumerate(out_metas)
            if not (m.dtype.is_floating_point or m.dtype.is_complex)
        )
        self.grad_rule = NO_GRAD if len(self.int_outs) == len(out_metas) else NEEDS_GRAD
        self.out_grad: tuple[tuple[bool, tuple[int, ...]], ...] = ()
        self.shared: tuple[tuple[torch.Tensor, int], ...] = ()
        # a cached call's: the tensors from outside that shared tensors its template reads
        # were computed from (W for W * 2), with their versions then (see Recorder.flush)
        self.derived: tuple[tuple[torch.Tensor, int], ...] = ()
        self.family: Any = None  # a ragged.Family this signature batches with, if any
        self.length = 0  # in a family: the length of its ragged leading dim
        self.pool = id  # the signature whose pending buffer holds this one's nodes
        self.ref = ref
        self.keep: Any = False  # may serve later runs: True, or a weak reference to what it
        # lives by (see Graph.retire)

    def set_grad_rule(self, rule: int) -> None:
        """Say when the outputs require grad; outputs of integer dtypes never do."""
        self.grad_rule = NO_GRAD if len(self.int_outs) == len(self.out_metas) else rule

    def set_output_grad(self, out_grad: tuple[tuple[bool, tuple[int, ...]], ...] | None) -> None:
        """Give each output a rule of its own (:data:`MIXED_GRAD`), ``(needs, reads)``: it
        requires grad if ``needs`` or if one of the node's inputs at positions ``reads`` does;
        ``None`` leaves the rule as it is."""
        if out_grad is not None:
            self.grad_rule, self.out_grad = MIXED_GRAD, out_grad

    def grad_mode(self) -> AbstractContextManager[Any]:
        """The grad mode the nodes were recorded in, to run their step under (a no-op where
        it is the mode already, or was not recorded)."""
        mode = self.grad
        if mode is None or mode == torch.is_grad_enabled():
            return nullcontext()
        return torch.set_grad_enabled(bool(mode))

    def __repr__(self) -> str:
        ins = ", ".join(map(repr, self.in_metas))
        outs = ", ".join(map(repr, self.out_metas))
        return f"Signature({self.id}, {self.name}({ins}) -> {outs})"


class Pending:
    """One signature's nodes recorded and not yet run, owned by the graph.

    ``nodes`` are global node ids; ``inputs`` one row of ``len(sig.in_metas)`` value ids per
    node; ``instances`` the instance of each node; ``payloads`` the value of each source node.
    The buffer of a ragged family's first signature holds the nodes of every member, and
    ``members`` the signature of each (the scheduler groups them as one).
    """

    __slots__ = ("nodes", "inputs", "instances", "payloads", "members")

    def __init__(self) -> None:
        self.nodes: list[int] = []
        self.inputs: list[int] = []
        self.instances: list[int] = []
        self.payloads: list[Any] = []
        self.members: list[int] = []
