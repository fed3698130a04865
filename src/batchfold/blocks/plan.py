"""Block plans: a scheduled batch as picklable data, and how its outputs are gathered.

``CompiledModel.schedule`` returns the engine's plan with the output layout as a
:class:`BlockPlan` (:func:`pack_plan`); it pickles with ops by index (no modules, no
parameters), so a DataLoader worker can build it; :func:`bind_plan` binds its ops to the
model's modules on the device it runs on. After a run, the root outputs and metrics are gathered with one slice or
gather per step output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal, NamedTuple

import numpy as np
import torch
from torch import nn

from ..execute import Executor
from ..graph import Signature
from ..schedule import Plan
from .base import Block
from .sequences import Repeat
from .types import (
    BlockTypeError,
    BroadcastSequenceType,
    SequenceType,
    TensorType,
    TupleType,
    Type,
    VoidType,
)
from .walker import OpSpec, Tape

SequenceLayout = Literal["padded", "concat"]


class SequenceBatch(NamedTuple):
    """A batch of sequences of tensors as two tensors.

    ``values`` is ``[batch, max_len, *shape]`` zero-padded, or ``[total, *shape]`` with the
    sequences one after another (``compile(..., sequences="concat")``); ``lengths`` is
    ``[batch]`` (int64).
    """

    values: torch.Tensor
    lengths: torch.Tensor


@dataclass
class BlockPlan:
    """A scheduled batch: the engine's plan and where the model's outputs are in it.

    It pickles without modules or parameters (see :class:`~batchfold.schedule.Step`), so a
    DataLoader worker can make it; ``CompiledModel.run`` binds its ops to the model's modules
    on the model's device.

    Attributes:
        plan: the engine's plan.
        outputs: per output leaf, the value ids of every instance (sequences flattened).
        lengths: per output leaf, each instance's sequence length (``None`` for tensors).
        metrics: per metric, the value ids sent to it, in order.
        labels: per metric, the label sent with each value (``None`` when none was).
        metric_instances: per metric, the input index each value came from.
        instances: the number of inputs.
        model: which model's ops the plan's signatures refer to (a checksum of its op list).
        record_s, schedule_s: seconds spent walking the inputs and scheduling.
        bound: the model and device the signatures are bound to now (``None`` once
            pickled).
        live: the model's state when per-instance code (``Function(..., per_instance=True)``)
            recorded steps of the plan (see :func:`live_state`); ``None`` if none did.
    """

    plan: Plan
    outputs: list[np.ndarray]
    lengths: list[np.ndarray | None]
    metrics: dict[str, np.ndarray]
    labels: dict[str, list[Any]]
    metric_instances: dict[str, np.ndarray]
    instances: int
    model: int
    record_s: float = 0.0
    schedule_s: float = 0.0
    bound: tuple[object, torch.device] | None = None
    live: tuple[Any, ...] | None = None  # see live_state: where per-instance code recorded

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "bound": None}

    def __str__(self) -> str:
        return (
            f"BlockPlan: {self.instances} inputs, {self.plan.num_nodes} nodes "
            f"in {len(self.plan.steps)} steps"
        )


class OutputLeaf:
    """One tensor (or sequence of tensors) of the model's output, stacked over the batch."""

    __slots__ = ("index", "type", "sequence")

    def __init__(self, index: int, t: TensorType, sequence: bool) -> None:
        self.index, self.type, self.sequence = index, t, sequence


def _void_like(t: Type) -> bool:
    """Whether values of ``t`` hold nothing (void, sequences or tuples of void)."""
    if isinstance(t, TupleType):
        return all(_void_like(item) for item in t.items)
    if isinstance(t, SequenceType):
        return _void_like(t.elem)
    return isinstance(t, VoidType)


def output_layout(root: Block, t: Type, leaves: list[OutputLeaf]) -> Any:
    """The output structure: ``OutputLeaf`` per tensor or sequence of tensors, tuples, ``None``."""
    if _void_like(t):
        return None
    if isinstance(t, TensorType):
        leaves.append(OutputLeaf(len(leaves), t, False))
        return leaves[-1]
    if isinstance(t, SequenceType) and isinstance(t.elem, TensorType):
        leaves.append(OutputLeaf(len(leaves), t.elem, True))
        return leaves[-1]
    if isinstance(t, TupleType):
        return tuple(output_layout(root, item, leaves) for item in t.items)
    raise BlockTypeError(
        root,
        "model",
        "tensors, tuples of them or sequences of tensors",
        t,
        verb="must give",
        hint="Send other per-input values to a Metric; block.eval(x) shows any output.",
    )


def collect_outputs(
    layout: Any, value: Any, ids: list[list[int]], lengths: list[list[int]]
) -> None:
    """Append one input's output value ids (and sequence lengths) to the per-leaf lists."""
    if layout is None:
        return
    if type(layout) is OutputLeaf:
        if layout.sequence:
            ids[layout.index].extend(value)
            lengths[layout.index].append(len(value))
        else:
            ids[layout.index].append(value)
        return
    for item, part in zip(layout, value, strict=True):
        collect_outputs(item, part, ids, lengths)


def assemble_outputs(layout: Any, tensors: list[Any]) -> Any:
    """The output structure with each leaf's batched tensor (or sequence batch) in place."""
    if layout is None:
        return None
    if type(layout) is OutputLeaf:
        return tensors[layout.index]
    return tuple(assemble_outputs(item, tensors) for item in layout)


def map_tensors(value: Any, t: Type, fn: Callable[[int, TensorType], Any]) -> Any:
    """``value`` of type ``t`` with each tensor value id ``v`` replaced by ``fn(v, type)``."""
    if isinstance(t, TensorType):
        return fn(value, t)
    if isinstance(t, TupleType):
        return tuple(map_tensors(v, item, fn) for v, item in zip(value, t.items, strict=True))
    if isinstance(t, SequenceType):
        return [map_tensors(v, t.elem, fn) for v in value]
    if isinstance(t, BroadcastSequenceType):
        return Repeat(map_tensors(value.value, t.elem, fn))
    return value


def gather_rows(
    store: Executor, ids: np.ndarray, t: TensorType, device: torch.device
) -> torch.Tensor:
    """The values ``ids`` (of type ``t``) stacked along dim 0, ``[0, *shape]`` when empty: a
    tensor of its own, as a stack of eager values is (rows in order are a view of their step's
    output, which other outputs, metrics and the backward pass read: a write into one reached
    them)."""
    if len(ids) == 0:
        return torch.zeros((0, *t.shape), dtype=t.dtype, device=device)
    rows = store.rows(ids)
    return rows.clone() if rows._base is not None else rows


def sequence_batch(
    flat: torch.Tensor, lengths: np.ndarray, layout: SequenceLayout
) -> SequenceBatch:
    """Sequences given one after another (``flat``) as a padded or concatenated batch."""
    counts = torch.from_numpy(lengths)
    if layout == "concat":
        return SequenceBatch(flat, counts)
    if len(lengths) == 0:  # no sequences: [0, 0, *shape], as padded ones of any batch
        return SequenceBatch(flat.new_zeros((0, 0, *flat.shape[1:])), counts)
    batch, longest = len(lengths), int(lengths.max())
    rows = torch.repeat_interleave(torch.arange(batch), counts)
    starts = torch.repeat_interleave(counts.cumsum(0) - counts, counts)
    cols = torch.arange(len(flat)) - starts
    padded = flat.new_zeros((batch, longest, *flat.shape[1:]))
    index = (rows.to(flat.device), cols.to(flat.device))
    return SequenceBatch(padded.index_put(index, flat), counts)


def pack_plan(
    plan: Plan,
    tape: Tape,
    outs: list[Any],
    layout: Any,
    leaves: list[OutputLeaf],
    checksum: int,
    token: object,
) -> BlockPlan:
    """The engine plan with the value ids of a compiled model's outputs and metrics.

    Arguments:
        plan: the scheduled engine plan.
        tape: the tape the batch was recorded on (its metrics, labels and device).
        outs: each input's recorded output, as value ids.
        layout: the model's output layout (see :func:`output_layout`).
        leaves: the model's output leaves.
        checksum: the checksum of the model's op list.
        token: the model's token, which a plan bound to the model holds.

    Returns:
        The block plan, bound to the model on the tape's device.
    """
    ids: list[list[int]] = [[] for _ in leaves]
    lengths: list[list[int]] = [[] for _ in leaves]
    for out in outs:
        collect_outputs(layout, out, ids, lengths)
    return BlockPlan(
        plan=plan,
        outputs=[np.asarray(i, dtype=np.int64) for i in ids],
        lengths=[
            np.asarray(n, dtype=np.int64) if leaf.sequence else None
            for n, leaf in zip(lengths, leaves, strict=True)
        ],
        metrics={k: np.asarray(v, dtype=np.int64) for k, v in tape.metrics.items()},
        labels=tape.labels,
        metric_instances={
            k: np.asarray(v, dtype=np.int64) for k, v in tape.metric_instances.items()
        },
        instances=len(outs),
        model=checksum,
        bound=(token, tape.device),
    )


def live_state(model: nn.Module, token: object, computed: Any) -> tuple[Any, ...]:
    """What steps recorded by per-instance code depend on: the model (its token), the grad
    and inference modes, each module's train/eval mode, and where the code ``computed``
    values from the weights alone when the plan was scheduled (``W * 2``, kept as a
    constant of the plan), each weight's identity and version; ops that read a weight read it
    when the plan runs. ``computed``: a flag, or the recorder of the per-instance code."""
    if not isinstance(computed, bool):  # at schedule(): the per-instance code's recorder
        if torch.utils.data.get_worker_info() is not None:  # its plan cannot be pickled back
            raise ValueError(
                "schedule() in a DataLoader worker of a model with per-instance code "
                "(Function(..., per_instance=True)): its plan holds that code's live steps, "
                "which cannot be sent to the main process (the loader would wait forever). "
                "Schedule in the main process, or make the Function batched."
            )
        computed = computed is not None and computed.shared_calls.computed()
    tensors = (*model.parameters(), *model.buffers())
    return (
        token,
        torch.is_grad_enabled(),
        torch.is_inference_mode_enabled(),
        tuple(m.training for m in model.modules()),
        tuple((id(t), t._version) for t in tensors) if computed else None,
    )


def weight_dtypes(model: nn.Module) -> dict[str, torch.dtype]:
    """The dtype of each of a model's parameters and buffers, by name."""
    return {name: t.dtype for name, t in (*model.named_parameters(), *model.named_buffers())}


def refuse_stale_plan(
    plan: BlockPlan, model: nn.Module, token: object, compiled: dict[str, torch.dtype] | None
) -> None:
    """Refuse to run a plan on a model whose weights changed dtype since it was compiled (with
    ``compiled``), or one with steps recorded by per-instance code in a state other than the
    one it was scheduled in (see :func:`live_state`)."""
    dtypes = weight_dtypes(model)
    moved = [n for n, d in dtypes.items() if compiled is not None and compiled.get(n, d) != d]
    if moved:
        raise ValueError(
            f"the model's weight {moved[0]} is {dtypes[moved[0]]} now, not the dtype it was compiled with "
            "(model.double(), .half() or .to(dtype) after compile): its blocks' input and "
            "output types were fixed when it was compiled. Compile the blocks again after "
            "moving the weights, or give the blocks that dtype (Vector(3, torch.float64))."
        )
    if plan.live is None or plan.live == (
        now := live_state(model, token, plan.live[-1] is not None)
    ):
        return
    what = (
        "another model (a copy?) runs it",
        "the grad mode has changed",
        "inference mode has changed",
        "a module has been switched between train and eval",
        "a weight has been updated in place (an optimizer step) or replaced",
    )
    changed = next(w for w, a, b in zip(what, plan.live, now, strict=True) if a != b)
    raise ValueError(
        "this plan holds steps recorded by per-instance code (Function(..., "
        "per_instance=True)), which keep what the code computed from the model's weights and "
        f"modes when schedule() ran, and {changed}. Schedule the batch again in the "
        "state it is to run in (or call the model on it)."
    )


def bind_plan(
    block_plan: BlockPlan,
    model: Any,
    specs: list[OpSpec],
    checksum: int,
    token: object,
    device: torch.device,
) -> Plan:
    """The plan with its ops bound to a compiled model's modules and tensors on ``device``.

    A plan made for this model on this device is returned as it is; one made by another process
    (unpickled) or for another device gets the model's signatures by each one's ``ref``, its
    constants afresh and its tensor payloads moved to ``device``.

    Arguments:
        block_plan: the plan.
        model: the compiled model, which its constants are read from.
        specs: the model's op specs, by index.
        checksum: the checksum of the model's op list.
        token: the model's token (see :func:`pack_plan`).
        device: the device to run on.

    Returns:
        The engine plan.

    Raises:
        ValueError: the plan was scheduled by a model with other ops.
    """
    plan = block_plan.plan
    if block_plan.bound == (token, device):
        return plan
    if block_plan.model != checksum:
        raise ValueError(
            "this plan was scheduled by a model with other ops; run it with the model whose "
            "schedule() made it (or a copy of that model)"
        )
    made: dict[int, Signature] = {}
    steps = []
    for step in plan.steps:
        ref = step.sig.ref
        if ref is None:  # recorded by per-instance lazy code: keeps its live signature
            steps.append(step)
            continue
        spec = specs[ref]
        sig = made.get(ref)
        if sig is None:
            sig = made[ref] = spec.signature(ref, ("block", spec), device, None)
        payloads = step.payloads
        if spec.constant is not None:
            payloads = [spec.constant(model, device)] * len(step.nodes)
        elif spec.source == "tensor" and payloads and payloads[0].device != device:
            payloads = list(torch.stack(payloads).to(device).unbind(0))
        steps.append(replace(step, sig=sig, payloads=payloads))
    return Plan(steps, plan.node_base, plan.node_step, plan.node_row)


__all__ = [
    "BlockPlan",
    "SequenceBatch",
    "SequenceLayout",
]
