"""Cached traces of module calls on ragged inputs: one node per call, whatever its length.

A module called on a sequence ``[T, d]`` (or a molecule's ``[atoms, d]``) is keyed with the
leading dim of its ragged inputs left out (see :mod:`.ragged_keys`), so calls of every length
share one cache entry. A trace becomes a :class:`RaggedTemplate` when every op that reads a
ragged value has a ragged rule (:mod:`batchfold.ragged`) for exactly those inputs at the
call's length, and ops on fixed values only read fixed values. The entry is confirmed by two
traces of *different* lengths that recorded the same ops, and guards on the length (see
:mod:`.lengths`) hold for each later call. Each length then gets a member signature of one
``"macro"`` family, so the calls of all lengths run as one packed step: the template's ops
replayed on the packed rows, ragged ops by their ragged rule, fixed ops by their batched
rule.

The ragged inputs may have several lengths (a molecule's ``[atoms, d]`` atoms, its
``[pairs, e]`` pairs and ``[pairs, 2]`` atom indices): each distinct length is a class (see
:mod:`.lengths`), ops that pick rows of one class by indices of another (``index_select``,
``x[i]``, ``index_add``) run on the packed rows with each instance's indices moved to its
rows, and a node's lengths are all its classes'. Such a call is confirmed by two traces in
which every length differs, and returns fixed values or rows of its first class.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from ..graph import Graph, Signature, TensorMeta
from ..ops import OpRule
from ..ragged import Family
from .dry_trace import still_ragged
from .inference import template
from .kept import keep, kept
from .lazy_trees import build
from .lengths import FIXED, SQUARE, guards_hold
from .ragged_keys import RAGGED
from .ragged_templates import RaggedTemplate, ragged_template
from .semantics import own_hooks
from .sites import user_site
from .tensor import Lazy

if TYPE_CHECKING:
    from .macros import ModuleCache
    from .recorder import Recorder

Tensor = torch.Tensor
ORIGINAL_CALL = nn.Module._call_impl  # hooks, then forward: what the cache stands in for (hooks.py)
GUARDED = "a comparison on the length of its ragged inputs answers otherwise: recorded op by op"


def call_ragged(
    cache: ModuleCache,
    module: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    key: Any,
    inputs: list[int],
    metas: tuple[TensorMeta, ...],
    flags: tuple[int, ...],
    lengths: tuple[int, ...],
) -> Any:
    """``module(*args, **kwargs)`` on ragged inputs (the rest of the arguments as
    :func:`ragged_key` gave them): one node of its lengths once confirmed, else traced or
    recorded op by op."""
    entry = cache.entry_for(key, module)
    name = type(module).__name__
    empty = 0 in lengths  # replayed only where exact, never traced (see EMPTY_SAFE)
    if entry.macro is not None and not own_hooks(module):
        if empty and not entry.macro.found.empty_ok:
            cache.misses[f"{name}: {EMPTY}"] += 1
        elif guards_hold(entry.guards, lengths):
            cache.hits += 1
            return entry.macro.node(cache.rec, inputs, metas, lengths)
        else:
            cache.misses[f"{name}: {GUARDED}"] += 1
        return ORIGINAL_CALL(module, *args, **kwargs)
    if entry.reason is not None or entry.macro is not None:
        cache.misses[f"{name}: {entry.reason or 'it has hooks'}"] += 1
        return ORIGINAL_CALL(module, *args, **kwargs)
    if entry.ragged is None and (earlier := kept(key, module)) is not None:
        found, guards, traced = earlier  # confirmed by an earlier batch_map
        usable = not empty or found.empty_ok  # at 0 rows: compared as at any length
        call = (args, kwargs)
        if usable and still_ragged(cache, key, earlier, module, call, inputs, flags, lengths):
            entry.ragged, entry.length, entry.guards = found, traced, guards
            entry.macro = _kept_macro(cache.rec, key, found, module, (args, kwargs), flags)
            cache.hits += 1
            return entry.macro.node(cache.rec, inputs, metas, lengths)
    if empty:  # a trace at 0 rows cannot tell a reduction over rows from one over none
        cache.misses[f"{name}: {EMPTY}"] += 1
        return ORIGINAL_CALL(module, *args, **kwargs)
    trace, result = cache.trace_call(module, args, kwargs, inputs, lengths, flags)
    if trace.aliased:  # see Trace.aliased
        cache.misses[f"{name}: {ALIASED}"] += 1
        return result
    cache.note_reads(entry, trace)
    found: Any = trace.finish(result, cache.rec.store.fallbacks, cache.rec.graph.views)
    if not isinstance(found, str):
        found = RETURNS_ARGUMENT if found.handed_back else ragged_template(found, flags, lengths)
    if isinstance(found, str):
        entry.reason = found
    elif entry.ragged is None:
        entry.ragged, entry.length, entry.guards = found, lengths, trace.guards
    elif not found.same_as(entry.ragged) or trace.guards != entry.guards:
        entry.reason = "records different ops for inputs of different lengths"
    elif all(a != b for a, b in zip(lengths, entry.length, strict=True)):
        # confirmed by two traces in which every length differs
        entry.macro = RaggedMacro(cache.rec.graph, module, found, (args, kwargs), flags)
        entry.macro.derived = cache.rec.shared_calls.sources(t for t, _ in entry.macro.shared)
        keep(key, module, found.ops, entry.macro.shared, entry.read, (found, trace.guards, lengths))
    if entry.reason is not None:
        cache.misses[f"{name}: {entry.reason}"] += 1
    return result


ALIASED = "gets one value at two argument positions (recorded op by op; see Trace.aliased)"
EMPTY = "takes a sequence of 0 rows, and no confirmed trace that gives eager's result for it"
RETURNS_ARGUMENT = "returns one of its arguments (a call on sequences)"


def _kept_macro(
    rec: Recorder,
    key: Any,
    found: RaggedTemplate,
    module: nn.Module,
    call: tuple[tuple[Any, ...], dict[str, Any]],
    flags: tuple[int, ...],
) -> RaggedMacro:
    """The macro of a call confirmed by an earlier ``batch_map``: the one the graph kept for
    this template (its member signatures, one per length, made in earlier runs), bound to
    this run, or a new one the graph keeps (see :class:`KeptMacro`)."""
    held = rec.graph.macros.get(key)
    if held is not None and held.found is found and held.macro.module() is module:
        held.macro.bind(found.for_store(rec.store.fallbacks))
        return held.macro
    macro = RaggedMacro(rec.graph, module, found.for_store(rec.store.fallbacks), call, flags)
    held = rec.graph.macros[key] = KeptMacro(found, macro)
    macro.keep = weakref.ref(held)
    return macro


class KeptMacro:
    """A ragged macro kept with its graph for later runs, and the template it was made from.

    The graph's ``macros`` holds it by the call's cache key. Its member signatures are kept
    while it is (their ``keep`` is a weak reference to it), so a macro replaced by a new
    template (the module changed) or dropped with its module (``lazy.graphs.give_back``)
    takes them along at the next ``Graph.retire``. The macro holds its module weakly.
    """

    __slots__ = ("found", "macro", "__weakref__")

    def __init__(self, found: RaggedTemplate, macro: RaggedMacro) -> None:
        self.found, self.macro = found, macro


class RaggedMacro:
    """A confirmed ragged call: its family, and a member signature per set of lengths."""

    def __init__(
        self,
        graph: Graph,
        module: nn.Module,
        found: RaggedTemplate,
        call: tuple[tuple[Any, ...], dict[str, Any]],
        flags: tuple[int, ...],
    ) -> None:
        self.graph, self.found = graph, found
        self.module = weakref.ref(module)  # a kept macro must not keep its module alive
        self.kind = type(module)
        self.name = type(module).__name__
        self.keep: Any = False  # for its member signatures: see KeptMacro
        self.call_template = (template(call[0], []), template(call[1], []))
        self.site = user_site()
        self.shared = found.shared_now()
        self.derived: tuple[tuple[Tensor, int], ...] = ()  # see Signature.derived
        self.outs = tuple(found.ops[j][0].out_metas[o] for _, j, o in found.outputs)
        self.flags = flags
        self.ragged_in = tuple(f != FIXED for f in flags)
        self.square = flags.index(SQUARE) if SQUARE in flags else -1
        self.secondary = tuple(i for i, f in enumerate(flags) if f > SQUARE)
        self.members: dict[tuple[int, ...], Signature] = {}
        self.family: Family | None = None

    def bind(self, found: RaggedTemplate) -> None:
        """Run in a new ``batch_map``: replay ``found`` (the template, counting fallbacks in
        the new run's statistics) and see the weights' versions as of now."""
        self.found = found
        self.shared = found.shared_now()
        for sig in self.members.values():
            sig.shared = self.shared
            sig.set_grad_rule(found.grad_rule)
            sig.set_output_grad(found.node_grad(len(sig.in_metas)))
        if self.family is not None:
            self.family.replay = found.replay_packed

    def node(
        self,
        rec: Recorder,
        inputs: list[int],
        in_metas: tuple[TensorMeta, ...],
        lengths: tuple[int, ...],
    ) -> Any:
        """Record one call of ``lengths`` as a node; its lazy output(s)."""
        sig = self.members.get(lengths) or self._signature(in_metas, lengths)
        first = self.graph.add(sig, inputs, rec.instance)
        outs = [Lazy(rec, first + o, meta) for o, meta in enumerate(sig.out_metas)]
        for i, j in self.found.repeats:  # returned twice: the same object, as eagerly
            outs[i] = outs[j]
        return build(self.found.structure, outs)

    def _signature(self, in_metas: tuple[TensorMeta, ...], lengths: tuple[int, ...]) -> Signature:
        found, length = self.found, lengths[0]
        out_metas = tuple(
            TensorMeta.of((length, *m.shape[1:]), m.dtype, m.device) if r else m
            for m, r in zip(self.outs, found.ragged_out, strict=True)
        )
        sig = self.graph.signature(
            (RAGGED, id(self), lengths),
            func=self.kind,
            rule=OpRule(self.name, self._uniform),
            name=self.name,
            template=self.call_template,
            in_metas=in_metas,
            out_metas=out_metas,
            multi=None if found.structure is None else tuple,
            site=self.site,
        )
        if self.family is None:  # the first member: the family's representative
            self.family = Family(
                len(self.graph.families),
                "macro",
                self.ragged_in,
                found.ragged_out,
                sig.id,
                square=self.square,
                outs=out_metas,
                secondary=self.secondary,
                replay=found.replay_packed,
            )
            self.graph.families[(RAGGED, id(self))] = self.family
        sig.shared, sig.family, sig.length = self.shared, self.family, length
        sig.derived = self.derived
        sig.set_grad_rule(found.grad_rule)
        sig.set_output_grad(found.node_grad(len(in_metas)))
        sig.pool, sig.keep = self.family.rep, self.keep
        self.members[lengths] = sig
        return sig

    def _uniform(self, sig: Signature, inputs: list[Tensor], n: int) -> Any:
        """A step whose nodes all have the same lengths: ``[n, L, ...]`` in and out."""
        length = sig.length
        packed = [
            x.reshape(-1)
            if i == self.square
            else x.reshape(n * x.shape[1], *x.shape[2:])
            if r
            else x
            for i, (x, r) in enumerate(zip(inputs, self.ragged_in, strict=True))
        ]
        sizes = {i: np.full(n, inputs[i].shape[1], dtype=np.int64) for i in self.secondary}
        outs = self.found.replay_packed(packed, np.full(n, length, dtype=np.int64), sizes)
        outs = tuple(
            y.view(n, length, *y.shape[1:]) if r else y
            for y, r in zip(outs, self.found.ragged_out, strict=True)
        )
        return outs[0] if sig.multi is None else outs
