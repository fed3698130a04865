"""The trace of one module call inside ``batch_map``, and the template it becomes.

While a module call is traced (see :mod:`.macros`), the recorder notes each node the call
adds in its :class:`Trace`; :meth:`Trace.finish` turns the trace into a :class:`Template`,
the call's ops with each input given by where it comes from (an argument of the call, or an
output of an earlier op), or says why the call cannot be cached.
"""

from __future__ import annotations

import copy
from typing import Any, TypeVar

import torch

from ..graph import Signature
from ..signature import INHERITS_GRAD, NO_GRAD
from ..step_calls import Fallbacks, run_op, sources_batch
from .function import BatchedFunction
from .inference import template
from .lazy_trees import build, flatten_lazies
from .lengths import FIXED, ROWS, SQUARE, Guard, class_of, rows_flag
from .semantics import VIEWS_OF_EVERY_ARGUMENT, base_name
from .sites import version
from .tensor import Lazy

Tensor = torch.Tensor


class Trace:
    """The nodes one module call adds while it is traced, and why it cannot be cached."""

    __slots__ = (
        "inputs",
        "start",
        "ops",
        "reason",
        "lengths",
        "guards",
        "ragged",
        "read_values",
        "read_tensors",
        "lazies",
    )

    def __init__(
        self,
        inputs: list[int],
        start: int,
        lengths: tuple[int, ...] | None = None,
        flags: tuple[int, ...] = (),
    ) -> None:
        self.inputs, self.start = inputs, start  # start: the first value id of the call
        self.ops: list[tuple[Signature, tuple[int, ...], int, Any]] = []
        self.reason: str | None = None
        # a call on ragged inputs: the leading dim of each length class (see lengths.py),
        # the guards on them, and the ragged values, the inputs' and those ragged rules made
        # from them: value id -> its flag (rows of a class, or the [L, L] input)
        self.lengths = lengths
        self.guards: list[Guard] = []
        self.ragged = {v: f for v, f in zip(inputs, flags, strict=False) if f}
        # what the call read of tensors from outside, besides what its ops read (see kept.py):
        # a value into Python (float(w), w.item()), and tensors whose attributes it read
        self.read_values = False
        self.read_tensors: list[Tensor] = []
        self.lazies: list[Lazy] = []  # the call's lazy arguments, one per input (if known)

    def add(self, sig: Signature, inputs: list[int], first: int) -> None:
        """Note a node the call recorded (an op on lazy inputs)."""
        self.ops.append((sig, tuple(inputs), first, None))
        ragged = self.ragged
        if ragged and sig.family is not None and self.lengths is not None:
            reads = tuple(ragged.get(v, 0) for v in inputs)
            if any(reads) and (out := reads_fit(sig, reads, self.lengths)) is not None:
                flag = rows_flag(out)
                ragged.update((first + o, flag) for o, r in enumerate(sig.family.ragged_out) if r)

    @property
    def aliased(self) -> bool:
        """Whether the call got one value at two argument positions (``h = c = zeros``): its
        ops cannot tell the two apart, so its template would read one where later calls,
        with two values, mean the other. Such a call is recorded, never made a template."""
        return len(set(self.inputs)) < len(self.inputs)

    def refuse(self, reason: str) -> None:
        """Mark the call as not cacheable (the first reason wins)."""
        if self.reason is None:
            self.reason = reason

    def finish(self, result: Any, fallbacks: Fallbacks, view_sigs: set[int]) -> Template | str:
        """The template of the traced call, or the reason it cannot be cached (``view_sigs``:
        the graph's signatures whose outputs may be views)."""
        if self.reason is not None:
            return self.reason
        outs: list[Lazy] = []
        structure = flatten_lazies(result, outs)
        if structure is False:
            return f"returns {type(result).__name__}, not lazy tensors (or tuples of them)"
        where: dict[int, tuple[int, ...]] = {
            v: (0, k) for k, v in reversed(list(enumerate(self.inputs)))
        }
        ops = []
        for j, (sig, ins, first, payload) in enumerate(self.ops):
            if any(v not in where for v in ins):
                return "reads a lazy value that is not among its arguments"
            ops.append((sig, tuple(where[v] for v in ins), payload))
            for o in range(len(sig.out_metas)):
                where[first + o] = (1, j, o)
        refs = []
        if not ops and all(where.get(out._vid, (1,))[0] == 0 for out in outs):
            # nothing recorded, arguments handed back (nn.Identity): the same objects again
            return Template([], [where[out._vid] for out in outs], structure, fallbacks)
        views = _views_of_arguments(ops, view_sigs)
        handed_back = []  # (position among the returned values, argument): the same object
        for position, out in enumerate(outs):
            ref = where.get(out._vid)
            if ref is None:
                return "returns a value made outside it"
            if ref[0] == 0:
                k = ref[1]
                if k >= len(self.lazies) or out is not self.lazies[k]:  # in another object
                    return "returns one of its arguments as another object"
                handed_back.append((position, ref[1]))
                continue
            if ref[1] in views:
                return "returns a view of an argument"
            refs.append(ref)
        if not refs:
            return "returns only its arguments, after recording ops it does not return"
        return Template(ops, refs, structure, fallbacks, tuple(handed_back))


def _views_of_arguments(
    ops: list[tuple[Signature, tuple[Any, ...], Any]], view_sigs: set[int]
) -> set[int]:
    """The ops whose outputs may view an argument of the call: an op the recorder marks as a
    view (``view_sigs``, the graph's: view ops, a ``bf.function`` that shares memory) of an
    argument, of any of them for some (``einsum``, a ``bf.function``), or of another such op's
    output (``b.t()[0]``)."""
    views: set[int] = set()
    for j, (sig, ins, _) in enumerate(ops):
        if sig.id in view_sigs:
            name = base_name(sig.func)
            every = name in VIEWS_OF_EVERY_ARGUMENT or type(sig.func) is BatchedFunction
            reads = ins if every else ins[:1]
            if any(ref[0] == 0 or ref[1] in views for ref in reads):
                views.add(j)
    return views


_Made = TypeVar("_Made", bound="Template")  # for_store keeps the kind of template


class Template:
    """A module call's ops, replayed on a whole batch as one step (see the module docstring)."""

    def __init__(
        self,
        ops: list[tuple[Signature, tuple[Any, ...], Any]],
        outputs: list[tuple[Any, ...]],
        structure: Any,
        fallbacks: Fallbacks,
        handed_back: tuple[tuple[int, int], ...] = (),
    ) -> None:
        self.ops, self.outputs, self.structure = ops, outputs, structure
        self.fallbacks = fallbacks
        self.handed_back = handed_back
        """Arguments the call returns as they are: ``(position among the returned values,
        argument)``, in order of position; ``outputs`` holds the other returned values."""
        self.node_grads: dict[int, tuple[tuple[bool, tuple[int, ...]], ...] | None] = {}
        self.repeats = tuple(
            (i, outputs.index(ref)) for i, ref in enumerate(outputs) if outputs.index(ref) < i
        )
        """Outputs the call returns again (``return t, t``): ``(position in outputs, its first
        position)``; a cached call returns the same object there, as eager does."""
        self.grad_rule = max((op.grad_rule for op, _, _ in ops), default=NO_GRAD)
        """When the call's outputs require grad: as the op that may most (``Signature.grad_rule``;
        a call of ops that require grad as their inputs do needs grad where an argument does)."""
        self.dropped_after = _dropped_after(ops, outputs)
        """After each op, the earlier ops whose values no later op reads and the call does not
        return: a replay drops them then, so that over many rows it holds only the values still
        to be read (their memory is reused by the next ops instead of new pages touched)."""

    def arguments(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The result of a call that records nothing and returns some of its arguments."""
        refs = self.outputs
        if all(k < len(args) for _, k in refs) and all(type(a) is Lazy for a in args):
            lazies: list[Any] = list(args)  # the common case: Identity(x)
        else:
            lazies = []
            template((args, kwargs), lazies)
        return build(self.structure, [lazies[k] for _, k in refs])

    def node_grad(self, inputs: int) -> tuple[tuple[bool, tuple[int, ...]], ...] | None:
        """Each output's own grad rule (``Signature.set_output_grad``) for a node of this call
        with ``inputs`` lazy inputs, or ``None`` where :attr:`grad_rule` gives every output's
        ``requires_grad`` as eager PyTorch does (all of them read a weight, or all inputs).
        Worked out once per template and count (a ragged macro asks for each length)."""
        if inputs in self.node_grads:
            return self.node_grads[inputs]
        rules = output_grad(self.ops, self.outputs)
        every = tuple(range(inputs))
        floats = [
            r
            for r, (_, j, o) in zip(rules, self.outputs, strict=True)
            if o not in self.ops[j][0].int_outs
        ]
        if self.grad_rule == NO_GRAD or (
            all(needs for needs, _ in floats)
            if self.grad_rule != INHERITS_GRAD
            else all(not needs and reads == every for needs, reads in floats)
        ):
            rules = None
        self.node_grads[inputs] = rules
        return rules

    def for_store(self: _Made, fallbacks: Fallbacks) -> _Made:
        """This template counting its fallback ops in another recorder's ``fallbacks``."""
        made = copy.copy(self)
        made.fallbacks = fallbacks
        return made

    def shared_now(self) -> tuple[tuple[Tensor, int], ...]:
        """The tensors from outside that the ops read, each with its version as of now (a
        template kept from an earlier ``batch_map`` saw older ones)."""
        with torch._C.DisableTorchFunction():  # a version is a getter: not for the recorder
            return tuple((t, version(t)) for op, _, _ in self.ops for t, _ in op.shared)

    def same_as(self, other: Template) -> bool:
        """Whether two traces of one key recorded the same ops, reading the same values."""
        return same_ops(self, other)

    def replay(self, sig: Signature, inputs: list[Tensor], n: int) -> Any:
        """Run the template's ops on ``inputs`` (``[n, ...]`` each): the batched outputs."""
        values: list[tuple[Tensor, ...] | None] = []
        for (op, refs, payload), done in zip(self.ops, self.dropped_after, strict=True):
            args = [inputs[r[1]] if r[0] == 0 else values[r[1]][r[2]] for r in refs]  # type: ignore[index]
            if not op.in_metas:  # a constant the call made (torch.zeros(...) inside forward)
                values.append((sources_batch(op, [payload] * n),))
            else:
                values.append(run_op(op, args, n, self.fallbacks))
            for j in done:
                values[j] = None
        outs = [values[j][o] for _, j, o in self.outputs]  # type: ignore[index]
        return outs[0] if self.structure is None else tuple(outs)


def output_grad(
    ops: list[tuple[Signature, tuple[Any, ...], Any]], outputs: list[tuple[Any, ...]]
) -> tuple[tuple[bool, tuple[int, ...]], ...]:
    """Per output of a traced call, when eager PyTorch gives it ``requires_grad``: ``(needs,
    reads)``, always if ``needs`` (an op on its way reads a weight), else if one of the call's
    inputs at positions ``reads`` requires grad (the inputs the ops on its way read)."""
    made: dict[tuple[int, int], tuple[bool, frozenset[int]]] = {}
    for j, (op, refs, _) in enumerate(ops):
        if op.grad_rule == INHERITS_GRAD:
            needs, reads = False, frozenset()
            for r in refs:
                if r[0] == 0:
                    reads |= {r[1]}
                else:
                    before = made[r[1], r[2]]
                    needs, reads = needs or before[0], reads | before[1]
            value = (needs, reads)
        else:  # NO_GRAD never; NEEDS_GRAD always (as the op's own signature has it)
            value = (op.grad_rule != NO_GRAD, frozenset())
        for o in range(len(op.out_metas)):
            made[j, o] = (False, frozenset()) if o in op.int_outs else value
    return tuple((n, tuple(sorted(rd))) for n, rd in (made[j, o] for _, j, o in outputs))


def _dropped_after(
    ops: list[tuple[Signature, tuple[Any, ...], Any]], outputs: list[tuple[Any, ...]]
) -> list[tuple[int, ...]]:
    """:attr:`Template.dropped_after` of these ops and outputs."""
    last = {r[1]: len(ops) for r in outputs if r[0] != 0}  # kept to the end (not arguments)
    for k, (_, refs, _) in enumerate(ops):
        for r in refs:
            if r[0] != 0 and last.get(r[1], -1) < k:
                last[r[1]] = k
    after: list[list[int]] = [[] for _ in ops]
    for j in range(len(ops)):
        k = last.get(j, j)  # read by none: dropped right away
        if k < len(ops):
            after[k].append(j)
    return [tuple(x) for x in after]


def same_ops(a: Any, b: Any, ragged: list[bool] | None = None) -> bool:
    """Whether two templates recorded the same ops on the same values and outputs; an op that
    runs on packed rows (``ragged``) counts as the same for any length of its family."""
    if len(a.ops) != len(b.ops) or a.outputs != b.outputs:
        return False
    if a.handed_back != b.handed_back:
        return False
    for j, ((sig, refs, payload), (sig2, refs2, payload2)) in enumerate(
        zip(a.ops, b.ops, strict=True)
    ):
        same = sig.family is sig2.family if ragged and ragged[j] else sig is sig2
        if not same or refs != refs2 or not same_payload(payload, payload2):
            return False
    return True


# ragged rules with an input of another length than the node's (its values index the node's)
_SECONDARY = frozenset(["index_rows", "index_add"])


def same_payload(a: Any, b: Any) -> bool:
    """Whether two constants a traced call made are equal (tensors by value; the sign of a
    zero counts, as ``1 / -0.0`` is ``-inf``)."""
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        if not (isinstance(a, Tensor) and isinstance(b, Tensor) and torch.equal(a, b)):
            return False
        return not a.is_floating_point() or torch.equal(a.signbit(), b.signbit())
    if type(a) is float and type(b) is float:
        return a.hex() == b.hex()
    return type(a) is type(b) and a == b


def reads_fit(sig: Signature, reads: tuple[int, ...], lengths: tuple[int, ...]) -> int | None:
    """The length class of an op's ragged outputs if the op, of a ragged family and reading
    values flagged ``reads`` (see :mod:`.lengths`) in a call of ``lengths``, runs on packed
    rows: its ragged rule's inputs are exactly those values, each of its class's length.
    ``None`` if it does not."""
    family = sig.family
    kind, metas = family.kind, sig.in_metas
    if kind == "blockdiag":
        fits = reads == (SQUARE, ROWS) and family.square == 0 and sig.length == lengths[0]
        return 0 if fits else None
    if SQUARE in reads or not all(reads) and (kind in _SECONDARY or family.secondary):
        return None
    if (
        kind in _SECONDARY
    ):  # rows[a].index_select(0, index[b]); target[a].index_add(0, index[b], ...)
        cls = [class_of(r) for r in reads]
        other, node = (0, 1) if kind == "index_rows" else (1, 0)
        if kind == "index_add" and cls[2] != cls[1]:
            return None
        fits = sig.length == lengths[cls[node]] and metas[other].shape[0] == lengths[cls[other]]
        return cls[node] if fits else None
    if family.secondary or family.ragged_in != tuple(r != FIXED for r in reads):
        return None
    classes = {class_of(r) for r in reads if r}
    if len(classes) != 1:
        return None
    cls = classes.pop()
    return cls if sig.length == lengths[cls] else None
