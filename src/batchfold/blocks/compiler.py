"""The compiler: a root block -> an ``nn.Module`` that records, schedules and runs batches.

``compile(root)`` specialises the root block to its input type once. ``model.schedule(inputs)``
walks each Python input once, adding nodes to a fresh :class:`~batchfold.graph.Graph`, and
schedules them into a picklable :class:`~batchfold.blocks.plan.BlockPlan`, so DataLoader
workers can build plans. ``model.run(plan)`` binds the plan's ops to this model's modules and
runs it with the engine's executor; ``model(inputs)`` does both.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from torch import nn

from .. import lazy
from ..errors import add_note
from ..execute import Executor
from ..graph import Graph, TensorMeta
from ..lazy import Lazy, Recorder
from ..profile import Profile
from ..schedule import Scheduler, check_scheduler, gc_paused, schedule
from ..stats import Stats
from .base import Block, Identity
from .codegen import generate
from .combinators import Record, Void
from .convert import constructors, convert_to_block
from .function import device_of
from .plan import (
    BlockPlan,
    OutputLeaf,
    SequenceLayout,
    assemble_outputs,
    bind_plan,
    gather_rows,
    live_state,
    map_tensors,
    output_layout,
    pack_plan,
    refuse_stale_plan,
    sequence_batch,
    weight_dtypes,
)
from .recursion import RecursionCheck, too_deep
from .sequences import Map
from .tensors import Tensor as TensorBlock
from .types import (
    BlockInputError,
    BlockTypeError,
    PyObjectType,
    SequenceType,
    TensorType,
    TupleType,
    Type,
    VoidType,
)
from .walker import Specializer, Tape, deep_recursion


def _reader(t: Type) -> Block:
    """A block that reads a Python value of type ``t`` (tensors, lazy values or numbers)."""
    if isinstance(t, TensorType):
        return TensorBlock(t.shape, t.dtype)
    if isinstance(t, TupleType):
        return Record([_reader(item) for item in t.items])
    if isinstance(t, SequenceType):
        return Map(_reader(t.elem))
    if isinstance(t, PyObjectType):
        return Identity()
    if isinstance(t, VoidType):
        return Void()
    raise ValueError(f"a model's input cannot be of type {t!r}")


_DERIVED = (
    "_walk",
    "_specs",
    "_checksum",
    "_token",
    "_metric_types",
    "_layout",
    "_leaves",
    "_layout_error",
    "_buffer_names",
    "_param_names",
)


class CompiledModel(nn.Module):
    """A block compiled to run on batches of Python inputs (see :func:`compile`).

    Calling it on a list of inputs returns ``(outputs, metrics)``: the root block's outputs
    stacked along dimension 0 (tuples stay tuples; sequences become :class:`SequenceBatch`)
    and one tensor per metric. Its submodules are the modules its blocks use, each once.
    """

    def __init__(
        self,
        root: Any,
        scheduler: Scheduler = "agenda",
        sequences: SequenceLayout = "padded",
        batch_outputs: bool = True,
    ) -> None:
        super().__init__()
        check_scheduler(scheduler)
        if sequences not in ("padded", "concat"):
            raise ValueError(f"sequences must be 'padded' or 'concat', got {sequences!r}")
        self.root = convert_to_block(root)
        self.scheduler: Scheduler = scheduler
        self.sequences: SequenceLayout = sequences
        self.batch_outputs = batch_outputs  # False: only evaluate (one input, any output)
        self.last_stats: Stats | None = None
        ctx = self._build()
        modules = list(ctx.modules.values())
        inner = {id(sub) for m in modules for sub in m.modules() if sub is not m}
        self.layers = nn.ModuleList([m for m in modules if id(m) not in inner])
        owned = {id(p) for p in self.layers.parameters()}
        self.tensors = nn.ParameterList(
            [t for t in ctx.tensors.values() if isinstance(t, nn.Parameter) and id(t) not in owned]
        )
        for tensor in ctx.tensors.values():
            name = self._buffer_names.get(id(tensor))
            if name is not None:
                self.register_buffer(name, tensor)
        self._dtypes = weight_dtypes(self)  # its blocks' types were made for these
        self._param_names = {id(t): name for name, t in self.named_parameters()}

    def _build(self) -> Specializer:
        """Specialise the root block; sets everything that is derived from the blocks."""
        root = self.root
        in_type = root.in_type if root.in_type is not None else PyObjectType()
        ctx = RecursionCheck()
        with torch._C.DisableTorchFunction():
            walker = ctx.child(root, in_type, "model")
            ctx.refuse_endless()
            if isinstance(in_type, (PyObjectType, VoidType)):
                self._walk = generate(walker, "model")
            else:
                read = ctx.child(_reader(in_type), PyObjectType(), "model.input").walk
                body = generate(walker, "model")
                self._walk = lambda tape, x: body(tape, read(tape, x))
        for decl, cell, target in ctx.forwards:  # recursion calls the generated functions
            cell.walk = generate(target, decl.name)
        self.in_type, self.out_type = in_type, walker.out_type
        self._specs = ctx.specs
        ops = "\n".join(f"{spec.name} {spec.site} {spec.source}" for spec in ctx.specs)
        self._checksum = zlib.crc32(ops.encode())
        self._token = object()  # a plan bound to this model (not pickled) holds it
        self._metric_types = {name: t for name, (t, _) in ctx.metrics.items()}
        self._leaves: list[OutputLeaf] = []
        self._layout: Any = None
        self._layout_error: BlockTypeError | None = None
        try:
            self._layout = output_layout(root, walker.out_type, self._leaves)
        except BlockTypeError as error:
            if self.batch_outputs:
                raise
            self._layout_error = error
        self._buffer_names = {
            id(t): f"constant{i}"
            for i, t in enumerate(ctx.tensors.values())
            if not isinstance(t, nn.Parameter)
        }
        self._param_names = {id(t): name for name, t in self.named_parameters()}
        return ctx

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for key in _DERIVED:
            state.pop(key, None)
        state["last_stats"] = None  # holds closures of the ops; rebuilt by the next run
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._build()

    @property
    def device(self) -> torch.device:
        """Where the model's parameters (or buffers) live; CPU when it has none."""
        return device_of([self])

    def tensor_for(self, tensor: torch.Tensor) -> torch.Tensor:
        """The model's current ``FromTensor`` tensor (moved by ``.to``, or assigned anew)."""
        name = self._buffer_names.get(id(tensor))
        if name is None and (param := self._param_names.get(id(tensor))) is not None:
            return self.get_parameter(param)
        return getattr(self, name) if name is not None else tensor

    def _tape(self, graph: Graph, recorder: Recorder | None = None) -> Tape:
        return Tape(graph, self.device, self, list(self._metric_types), recorder)

    def _record(self, tape: Tape, inputs: list[Any]) -> list[Any]:
        """Walk every input once, adding its nodes to the tape's graph."""
        walk, outs = self._walk, []
        with gc_paused(), deep_recursion():
            for index, x in enumerate(inputs):
                tape.instance = index
                try:
                    outs.append(walk(tape, x))
                except Exception as error:
                    if isinstance(error, RecursionError) and (deep := too_deep(error, index)):
                        raise deep from None  # its traceback is as deep as the input
                    if not isinstance(error, BlockInputError):  # that one names the input
                        add_note(error, f"(raised while recording input {index} of the batch)")
                    raise
        return outs

    def schedule(self, inputs: Iterable[Any]) -> BlockPlan:
        """Record and schedule a batch; the plan is picklable and runs with :meth:`run`.

        Arguments:
            inputs: the Python inputs of the batch.

        Returns:
            The plan.

        Example:
            >>> import pickle
            >>> from batchfold.blocks import Map, Scalar, Sum, compile
            >>> model = compile(Map(Scalar()) >> Sum())
            >>> plan = pickle.loads(pickle.dumps(model.schedule([[1.0, 2.0], [3.0]])))
            >>> model.run(plan)[0]
            tensor([3., 3.])
        """
        if self._layout_error is not None:
            raise self._layout_error
        start = time.perf_counter()
        inputs = list(inputs)
        graph = Graph()
        tape = self._tape(graph)
        outs = self._record(tape, inputs)
        recorded = time.perf_counter()
        plan = schedule(graph, self.scheduler)
        block_plan = pack_plan(
            plan, tape, outs, self._layout, self._leaves, self._checksum, self._token
        )
        block_plan.record_s, block_plan.schedule_s = (
            recorded - start,
            time.perf_counter() - recorded,
        )
        if any(step.sig.ref is None for step in plan.steps):  # per-instance code recorded
            block_plan.live = live_state(self, self._token, tape.recorder)
        return block_plan

    def run(self, plan: BlockPlan, profile: bool = False) -> tuple[Any, dict[str, torch.Tensor]]:
        """Run a plan made by :meth:`schedule` (here or in another process).

        Arguments:
            plan: the plan; its ops are bound to this model's modules on its device.
            profile: time every step per signature (``last_stats.profile``).

        Returns:
            ``(outputs, metrics)``: the root outputs batched along dim 0 and one tensor per
            metric (``[count, *shape]``, in the order the values were sent).
        """
        start = time.perf_counter()
        device = self.device
        refuse_stale_plan(plan, self, self._token, getattr(self, "_dtypes", None))
        engine = bind_plan(plan, self, self._specs, self._checksum, self._token, device)
        store = Executor()
        store.profile = Profile() if profile else None
        store.run(engine)
        tensors: list[Any] = []
        for leaf, ids, lengths in zip(self._leaves, plan.outputs, plan.lengths, strict=True):
            flat = gather_rows(store, ids, leaf.type, device)
            tensors.append(
                flat if lengths is None else sequence_batch(flat, lengths, self.sequences)
            )
        metrics = {
            name: gather_rows(store, plan.metrics[name], t, device)
            for name, t in self._metric_types.items()
        }
        self.last_stats = Stats(
            instances=plan.instances,
            nodes=engine.num_nodes,
            steps=len(engine.steps),
            segments=1,
            fallbacks=dict(store.fallbacks.counts),
            record_s=plan.record_s,
            schedule_s=plan.schedule_s,
            execute_s=time.perf_counter() - start,
            plan=engine,
            profile=store.profile,
        )
        if store.profile is not None:
            store.profile.phases = {
                "record": plan.record_s,
                "schedule": plan.schedule_s,
                "execute": self.last_stats.execute_s,
            }
        return assemble_outputs(self._layout, tensors), metrics

    def forward(
        self, inputs: Iterable[Any], profile: bool = False
    ) -> tuple[Any, dict[str, torch.Tensor]]:
        """``run(schedule(inputs))``: the batched outputs and the metric tensors."""
        return self.run(self.schedule(inputs), profile=profile)

    def evaluate(self, x: Any) -> Any:
        """Run the model on one input; the output keeps its structure, without a batch dim.

        Inside ``batch_map`` the nodes join the running batch and the result holds lazy
        values (inputs may hold lazy values too). Returns ``(output, metrics)`` when the
        model has metrics, else the output.

        Example:
            >>> from batchfold.blocks import Map, Scalar, compile
            >>> compile(Map(Scalar())).evaluate([1.0, 2.0])
            [tensor(1.), tensor(2.)]
        """
        rec = lazy.active_recorder()
        if rec is not None:
            return self._evaluate_lazy(x, rec)
        device = self.device
        graph = Graph()
        tape = self._tape(graph)
        (out,) = self._record(tape, [x])
        store = Executor()
        store.run(schedule(graph, "depth"))  # one input: depth-based is as good and cheaper
        ids: list[int] = []
        map_tensors(out, self.out_type, lambda v, t: ids.append(v))
        values = iter(store.values(ids, fresh=True) if ids else [])
        result = map_tensors(out, self.out_type, lambda v, t: next(values))
        if not self._metric_types:
            return result
        metrics = {
            name: gather_rows(store, np.asarray(tape.metrics[name], dtype=np.int64), t, device)
            for name, t in self._metric_types.items()
        }
        return result, metrics

    def _evaluate_lazy(self, x: Any, rec: Recorder) -> Any:
        device = self.device
        tape = self._tape(rec.graph, rec)
        tape.instance = rec.instance
        with deep_recursion():
            out = self._walk(tape, x)

        def as_lazy(v: int, t: TensorType) -> Lazy:
            return Lazy(rec, v, TensorMeta.of(t.shape, t.dtype, device))

        result = map_tensors(out, self.out_type, as_lazy)
        if not self._metric_types:
            return result
        metrics = {  # stacked, as outside batch_map: one tensor of each metric's values
            name: _stacked(rec, [as_lazy(v, t) for v in tape.metrics[name]], t, device)
            for name, t in self._metric_types.items()
        }
        return result, metrics

    def extra_repr(self) -> str:
        return f"root={self.root!r}"


def _stacked(rec: Recorder, values: list[Lazy], t: TensorType, device: torch.device) -> Any:
    """One instance's values of a metric as one lazy tensor ``[len(values), *t.shape]``."""
    if values:
        return rec.call(torch.stack, (values,), {})
    return rec.call(torch.zeros, ((0, *t.shape),), {"dtype": t.dtype, "device": device})


def compile(
    root: Any, *, scheduler: Scheduler = "agenda", sequences: SequenceLayout = "padded"
) -> CompiledModel:
    """Compile a block into a model that runs batches of Python inputs.

    Arguments:
        root: the block (or anything that converts to one).
        scheduler: ``"agenda"`` (DyNet's) or ``"depth"`` (TensorFlow Fold's); same values.
        sequences: how sequence outputs come back: ``"padded"`` or ``"concat"``.

    Returns:
        The :class:`CompiledModel`.

    Raises:
        BlockTypeError: a block cannot take the type it is given, a forward declaration was
            never resolved or recurses on every path, or the root's output cannot be batched.

    Example:
        >>> from batchfold.blocks import Map, Scalar, Sum
        >>> model = compile(Map(Scalar()) >> Sum())
        >>> outputs, metrics = model([[1.0, 2.0], [], [4.0]])
        >>> outputs
        tensor([3., 0., 4.])
    """
    return CompiledModel(root, scheduler=scheduler, sequences=sequences)


constructors.evaluator = lambda block: CompiledModel(block, batch_outputs=False)

__all__ = [
    "CompiledModel",
    "compile",
]
