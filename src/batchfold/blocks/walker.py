"""The walk machinery: op specs, walkers, specialisation and the recording tape.

:meth:`Specializer.child` turns a block and an input type into a :class:`Walker`: the output
type plus a ``walk(tape, x)`` function that reads one Python input and adds its nodes to a
:class:`~batchfold.graph.Graph` through a :class:`Tape`. Tensor values at walk time are value
ids (ints); tuples are tuples, sequences are lists, Python objects are themselves. Each kind
of node a block records is described by an :class:`OpSpec`, which makes the graph
``Signature`` once per graph. Blocks themselves are in :mod:`.base`; this module knows them
only as objects with ``_specialize(in_type, ctx, path)``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn

from ..graph import Graph, Signature, Slot, TensorMeta
from ..lazy import Lazy, Recorder
from ..ops import OpRule
from .types import (
    BlockInputError,
    BlockTypeError,
    PyObjectType,
    TensorType,
    TupleType,
    Type,
    VoidType,
    short,
)

if TYPE_CHECKING:
    from .base import Block
    from .codegen import Emit, Emitter, Symbol

Walk = Callable[["Tape", Any], Any]
SourceKind = Literal["scalar", "tensor", "constant"]


def _no_batched_call(sig: Signature, inputs: list[torch.Tensor], n: int) -> Any:
    raise AssertionError("source steps are built by the executor from their payloads")


SOURCE_RULE = OpRule("source", _no_batched_call, cheap=True)


class OpSpec:
    """One kind of graph node a block records: op, input and output tensor types, and name.

    ``source`` marks nodes with no inputs whose values come from per-node payloads:
    ``"scalar"`` (Python numbers or nested lists), ``"tensor"`` (tensors to stack) or
    ``"constant"`` (``constant(model, device)`` builds the one tensor, e.g. a parameter).
    ``index`` is its place among the compiled model's specs (set when it is registered); its
    graph signatures carry it as their ``ref``, so plans that hold them can be pickled.
    """

    __slots__ = (
        "name",
        "site",
        "rule",
        "func",
        "template",
        "in_types",
        "out_types",
        "multi",
        "source",
        "constant",
        "index",
    )

    def __init__(
        self,
        name: str,
        site: str,
        in_types: tuple[TensorType, ...],
        out_types: tuple[TensorType, ...],
        rule: OpRule = SOURCE_RULE,
        func: Callable[..., Any] | None = None,
        template: tuple[Any, Any] = ((), {}),
        multi: bool = False,
        source: SourceKind | None = None,
        constant: Callable[[Any, torch.device], torch.Tensor] | None = None,
    ) -> None:
        self.name, self.site, self.rule = name, site, rule
        self.func = func if func is not None else _no_batched_call
        self.in_types, self.out_types, self.multi = in_types, out_types, multi
        self.source, self.constant = source, constant
        self.template = template
        self.index = -1

    def signature(
        self, sig_id: int, key: Any, device: torch.device, graph: Graph | None
    ) -> Signature:
        """The graph signature of these nodes on ``device`` (registered in ``graph`` if given)."""
        in_metas = tuple(TensorMeta.of(t.shape, t.dtype, device) for t in self.in_types)
        out_metas = tuple(TensorMeta.of(t.shape, t.dtype, device) for t in self.out_types)
        fields: dict[str, Any] = {
            "func": self.func,
            "rule": self.rule,
            "name": self.name,
            "template": self.template,
            "in_metas": in_metas,
            "out_metas": out_metas,
            "multi": tuple if self.multi else None,
            "site": self.site,
            "source": self.source,
            "ref": self.index if self.index >= 0 else None,
        }
        if graph is not None:
            return graph.signature(key, **fields)
        return Signature(sig_id, key, **fields)

    def __repr__(self) -> str:
        return f"OpSpec({self.name} at {self.site})"


class Walker:
    """A block specialised to one input type: its output type and its ``walk(tape, x)``.

    ``emit``, when set, writes the same walk as inlined Python (see :mod:`.codegen`).
    """

    __slots__ = ("out_type", "walk", "emit")

    def __init__(self, out_type: Type, walk: Walk, emit: Emit | None = None) -> None:
        self.out_type, self.walk, self.emit = out_type, walk, emit


class Specializer:
    """Specialises blocks to input types, once per (block, type), and collects what they use.

    ``compile`` mode collects the op specs, modules, tensors and metrics of a model; ``check``
    mode (at composition time) only infers types and tolerates unresolved declarations.
    """

    def __init__(self, check: bool = False) -> None:
        self.check = check
        # the block is kept with its walker so that its id is never reused while memoised
        self.memo: dict[tuple[int, Type], tuple[Any, Walker]] = {}
        self.specs: list[OpSpec] = []
        self.modules: dict[int, nn.Module] = {}
        self.tensors: dict[int, torch.Tensor] = {}
        self.metrics: dict[str, tuple[TensorType, str]] = {}
        self.shared: dict[Any, OpSpec] = {}
        self.forwards: list[tuple[Any, Walker, Walker]] = []  # (declaration, cell, target)

    def child(self, block: Block, in_type: Type, path: str) -> Walker:
        """The walker of ``block`` on ``in_type``; ``path`` says where the block sits."""
        key = (id(block), in_type)
        found = self.memo.get(key)
        if found is not None:
            return found[1]
        walker = block._specialize(in_type, self, path)
        self.memo[key] = (block, walker)
        return walker

    def forward(self, decl: Any) -> Walker:
        """A walker that calls the block a ``ForwardDeclaration`` resolves to (recursion)."""
        key = (id(decl), decl.input_type)
        found = self.memo.get(key)
        if found is None:
            cell = Walker(decl.output_type, _unresolved(decl))
            if decl.target is None:
                if self.check:
                    return cell
                raise BlockTypeError(
                    decl,
                    decl.name,
                    "resolve_to(block) before the model is compiled",
                    None,
                    verb="needs",
                )
            self.memo[key] = (decl, cell)
            inner = self.child(decl.target, decl.input_type, decl.name)
            if inner.out_type != decl.output_type:
                raise BlockTypeError(
                    decl.target,
                    decl.name,
                    f"to give {decl.output_type!r}, the declared output type",
                    inner.out_type,
                    verb="is",
                )
            cell.walk = inner.walk
            self.forwards.append((decl, cell, inner))
        else:
            cell = found[1]

        def emit(em: Emitter, x: Symbol) -> Symbol:
            return em.assign(f"{em.const(cell, 'c')}.walk(tape, {em.expr(x)})")

        return Walker(decl.output_type, lambda tape, x: cell.walk(tape, x), emit)

    def spec(self, spec: OpSpec, share: Any = None) -> OpSpec:
        """Register one kind of node; returns it, or the spec already registered for ``share``.

        Blocks that wrap the same callable on the same types pass the same ``share`` key, so
        their nodes batch together.
        """
        if share is not None:
            found = self.shared.get(share)
            if found is not None:
                return found
            self.shared[share] = spec
        spec.index = len(self.specs)
        self.specs.append(spec)
        return spec

    def module(self, module: nn.Module) -> None:
        """Register a module whose parameters the model trains."""
        self.modules.setdefault(id(module), module)

    def tensor(self, tensor: torch.Tensor) -> None:
        """Register a constant or parameter tensor the model reads (``FromTensor``)."""
        self.tensors.setdefault(id(tensor), tensor)

    def metric(self, name: str, t: TensorType, block: Block, path: str) -> None:
        """Register a metric; every use of one name must send the same tensor type."""
        seen = self.metrics.setdefault(name, (t, path))
        if seen[0] != t:
            raise BlockTypeError(
                block,
                path,
                f"{seen[0]!r}, the type metric {name!r} gets at {seen[1]}",
                t,
                hint="Every value sent to one metric is stacked into one tensor.",
            )


def _unresolved(decl: Any) -> Walk:
    def walk(tape: Tape, x: Any) -> Any:
        raise AssertionError(f"{decl!r} was walked before it was resolved")

    return walk


class Tape:
    """Where one batch is recorded: the graph, the current instance, metrics and constants."""

    __slots__ = (
        "graph",
        "device",
        "model",
        "instance",
        "sigs",
        "memo",
        "metrics",
        "labels",
        "metric_instances",
        "recorder",
        "lazy",
    )

    def __init__(
        self,
        graph: Graph,
        device: torch.device,
        model: Any,
        metric_names: list[str],
        recorder: Recorder | None = None,
    ) -> None:
        self.graph, self.device, self.model = graph, device, model
        self.instance = 0
        self.sigs: dict[OpSpec, Signature] = {}
        self.memo: dict[Any, int] = {}
        self.metrics: dict[str, list[int]] = {name: [] for name in metric_names}
        self.labels: dict[str, list[Any]] = {name: [] for name in metric_names}
        self.metric_instances: dict[str, list[int]] = {name: [] for name in metric_names}
        self.recorder = recorder
        self.lazy = recorder is not None  # recording into a running batch_map

    def signature(self, spec: OpSpec) -> Signature:
        """The signature of ``spec`` in this tape's graph, made on first use."""
        sig = self.sigs.get(spec)
        if sig is None:
            key = ("block", spec)
            sig = self.graph.lookup(key)
            if sig is None:
                sig = spec.signature(0, key, self.device, self.graph)
            self.sigs[spec] = sig
        return sig

    def add(self, spec: OpSpec, inputs: tuple[int, ...] | list[int]) -> int:
        """Record one node of ``spec`` reading value ids ``inputs``; returns its first value id."""
        sig = self.sigs.get(spec) or self.signature(spec)
        return self.graph.add(sig, inputs, self.instance)

    def source(self, spec: OpSpec, payload: Any) -> int:
        """Record one source node holding ``payload``; returns its value id."""
        sig = self.sigs.get(spec) or self.signature(spec)
        return self.graph.add(sig, (), self.instance, payload)

    def shared_source(self, spec: OpSpec, key: Any, payload: Callable[[], Any]) -> int:
        """One source node per batch for ``(spec, key)`` (a constant), read by every instance."""
        memo_key = (spec, key)
        vid = self.memo.get(memo_key)
        if vid is None:
            vid = self.memo[memo_key] = self.source(spec, payload())
        return vid

    def constant(self, spec: OpSpec) -> int:
        """The value id of the constant tensor of ``spec`` (one node per batch)."""
        make = spec.constant
        assert make is not None

        def made() -> Any:  # a tensor, also inside batch_map (its recorder would make it lazy)
            with torch._C.DisableTorchFunction():
                return make(self.model, self.device)

        return self.shared_source(spec, None, made)

    def lazy_recorder(self) -> Recorder:
        """The recorder that per-instance lazy code inside a ``Function`` records through."""
        if self.recorder is None:
            self.recorder = InlineRecorder(self.graph)
        return self.recorder

    def fail(self, block: Block, path: str, message: str) -> BlockInputError:
        """An error for a bad Python input, naming the block, its place and the instance."""
        return BlockInputError(f"{short(block)} at {path}: {message} (input {self.instance})")


class InlineRecorder(Recorder):
    """Records the per-instance code of ``Function(..., per_instance=True)`` into a block graph."""

    moves_running_stats = False  # no batch_map's end to move them at: refused

    def __init__(self, graph: Graph) -> None:
        super().__init__(ragged=False, graph=graph)  # block plans hold one row per node

    def wait(self, lazy: Lazy, what: str, pause: bool = True) -> None:
        """Refuse every read of a value (``item()``, ``int()``, the tensor, a size)."""
        raise BlockInputError(
            f"{what} of a lazy value inside Function(..., per_instance=True): values are not "
            "computed while a block model records its inputs. Read values in code run by "
            "batch_map, or branch on the Python input with OneOf."
        )


@contextmanager
def deep_recursion() -> Iterator[None]:
    """Allow walks as deep as the inputs (recursive blocks on a 10,000-deep tree).

    Since Python 3.11 calls between Python functions do not grow the C stack, so a high
    recursion limit is safe; walks only call Python functions recursively.
    """
    old = sys.getrecursionlimit()
    if sys.version_info >= (3, 11):
        sys.setrecursionlimit(max(old, 200_000))
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


def void_or(t: Type) -> bool:
    """Whether ``t`` is void or a Python object (what input blocks accept); ``reads()`` with no
    wires gives an empty tuple, which is no input too."""
    return isinstance(t, (VoidType, PyObjectType)) or (isinstance(t, TupleType) and not t.items)


def tensor_template(t: Type, counter: list[int]) -> Any:
    """The argument structure of a tensor (tuple) type with a ``Slot`` per tensor, in order."""
    if isinstance(t, TensorType):
        counter[0] += 1
        return Slot(counter[0] - 1)
    assert isinstance(t, TupleType)
    return tuple(tensor_template(item, counter) for item in t.items)
