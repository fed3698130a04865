"""Cached traces of module calls: one graph node per ``nn.Module`` call (a macro node).

A call of an ``nn.Module`` on lazy inputs is recorded op by op the first two times it is made
with a given key (the module, its input shapes and dtypes, its other arguments, the grad mode
and train/eval). If both recorded the same ops and read no value, wrote nothing outside and drew
no random numbers outside their per-instance ops, the ops become a :class:`Template`: every later
call with that key is one graph node, whose batched step replays them on the whole batch.
Other calls are recorded op by op, and the statistics say why. ``cache_modules=False`` or
:func:`~.semantics.no_cache` switches it off. Ragged calls: see :mod:`.ragged_macros`.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..errors import add_note
from ..graph import OUT_BITS, Signature
from ..ops import OpRule
from .context import dry
from .dry_trace import still_kept
from .inference import template
from .kept import keep, kept
from .lazy_trees import build
from .lengths import LENGTH_NOTE, Guard, plain_result
from .module_state import EPOCH, Held, Watch, Watchers, attribute_state, changed_attribute
from .ragged_keys import (
    BY_SHAPE,
    SEQUENCE,
    by_shape,
    is_sequence,
    ragged_hit,
    ragged_key,
    takes_sequences,
)
from .ragged_macros import ALIASED, ORIGINAL_CALL, RaggedMacro, call_ragged
from .ragged_templates import RaggedTemplate
from .refusals import refuse_uninitialized
from .semantics import NO_CACHE, grad_mode, own_hooks
from .sites import user_site
from .tensor import Lazy
from .traces import Template, Trace

if TYPE_CHECKING:
    from .recorder import Recorder

MISSED = object()  # ModuleCache.hit found no confirmed entry
_grad_enabled = torch.is_grad_enabled
_inference_mode = torch.is_inference_mode_enabled


_ENTRY_FIELDS = """module template confirmed reason sig order outs flat single pair ragged length
guards macro read watch"""


class _Entry:
    __slots__ = tuple(_ENTRY_FIELDS.split())

    def __init__(self, module: nn.Module, watch: Watch) -> None:
        self.module = module  # kept alive: the key holds its id
        self.template: Template | None = None
        self.confirmed = False
        self.reason: str | None = None
        self.sig: Signature | None = None  # the macro's, or its one op's
        self.order: list[int] | None = None  # one op: which call inputs it reads, in order
        self.outs: list[int] = []  # which of the node's outputs the call returns
        self.flat: bool | None = None  # whether it returns a flat tuple, ``(h, c)``
        self.single: int | None = None  # the output it returns, when it returns one tensor
        self.pair: tuple[int, int] | None = None  # the two it returns as ``(h, c)``, if so
        # a call on ragged inputs: its first trace, that trace's length and guards, and once
        # a trace of another length agrees, the macro that records its calls
        self.ragged: RaggedTemplate | None = None
        self.length: tuple[int, ...] = ()  # each length class's
        self.guards: list[Guard] = []
        self.macro: RaggedMacro | None = None
        # tensors from outside whose attributes its traces read; None if they read a value
        # into Python or the key holds an object by identity (never kept then: see kept.py)
        self.read: list[torch.Tensor] | None = []
        self.watch = watch  # its modules' attribute sets (see module_state)


class ModuleCache:
    """The cached module traces of one ``batch_map`` (one recorder)."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.entries: dict[Any, _Entry] = {}
        self.hits = 0
        self.traced = 0
        self.misses: Counter[str] = Counter()
        self.epoch = EPOCH[0]  # module attribute sets seen (see module_state)
        self.watchers = Watchers()

    def release(self) -> None:
        """Drop the entries; a ragged macro's member signatures refer back to it, so its
        members go first (see ``Recorder.release``)."""
        for entry in self.entries.values():
            if entry.macro is not None and not entry.macro.keep:  # kept: see KeptMacro
                entry.macro.members.clear()
        self.entries = {}
        self.watchers = Watchers()

    def hit(self, module: nn.Module, args: tuple[Any, ...]) -> Any:
        """The common call, on its own fast path: lazy positional arguments only and a
        confirmed entry (for sequences, see :func:`ragged_hit`). Its result, or
        :data:`MISSED` (then :meth:`call`)."""
        rec = self.rec
        if EPOCH[0] != self.epoch:
            self.drop_changed()
        metas, inputs = [], []
        sequences = False
        ragged = rec.ragged
        for a in args:
            if type(a) is not Lazy or a._rec is not rec:
                return MISSED
            meta = a._meta
            if ragged and not sequences:
                seq = SEQUENCE.get(meta)
                if seq is None:
                    seq = SEQUENCE[meta] = is_sequence(meta)
                sequences = seq
            metas.append(meta)
            inputs.append(a._vid)
        if len(inputs) > 1 and len(set(inputs)) < len(inputs):
            return MISSED  # one value twice: keyed apart (see call)
        mode = 2 if _inference_mode() else 1 if _grad_enabled() else 0  # grad_mode(), inline
        if sequences:  # keyed without the length: the common ragged call, or the slow path
            found = ragged_hit(self, module, metas, inputs, mode)
            if found is not BY_SHAPE:
                return MISSED if found is None else found
        # the key :meth:`call` makes: ``args_key`` gives a lazy argument's meta
        entry = self.entries.get((id(module), module.training, mode, tuple(metas)))
        if (
            entry is None
            or not entry.confirmed
            or module._forward_hooks  # own_hooks(module), inline
            or module._forward_pre_hooks
            or module._backward_hooks
            or module._backward_pre_hooks
        ):
            return MISSED
        self.hits += 1
        if entry.sig is None:  # hands back some of its arguments, records nothing
            assert entry.template is not None
            return entry.template.arguments(args, {})
        return self._add(entry, inputs, args)

    def call(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``module(*args, **kwargs)`` inside ``batch_map``: a macro node, or traced op by op."""
        refuse_uninitialized(module)
        rec = self.rec
        if EPOCH[0] != self.epoch:
            self.drop_changed()
        rec.by_identity = rec.mutable_object = False
        if rec.ragged and takes_sequences(args, kwargs):  # keyed without the length
            found = ragged_key(self, module, args, kwargs)
            assert found is not None  # _takes_sequences: some lazy input has a dim
            rows = any(len(m.shape) >= 2 for m in found[2])
            if rec.mutable_object or _aliases(found[1]) is not None:
                return self._uncached(module, args, kwargs)
            if not by_shape(self.entries.get(found[0]), found[4], rows):
                return call_ragged(self, module, args, kwargs, *found)
        inputs: list[int] = []
        key = (id(module), module.training, grad_mode(), rec.args_key(args, inputs))
        if kwargs:
            key = (*key, rec.kwargs_key(kwargs, inputs))
        if (aliases := _aliases(inputs)) is not None:  # m(h, h): the forward may test q is k
            key = (*key, aliases)
        if rec.mutable_object:
            return self._uncached(module, args, kwargs)
        entry = self.entry_for(key, module)
        if entry.template is None and entry.reason is None:
            earlier = kept(key, module)  # confirmed by an earlier batch_map
            if earlier is not None and still_kept(
                self, key, earlier, module, (args, kwargs), inputs
            ):
                found = earlier.for_store(rec.store.fallbacks)
                entry.template, entry.confirmed = found, True
                name = type(module).__name__
                entry.sig = self._signature(name, module, args, kwargs, found)
                _set_outs(entry, list(range(len(earlier.outputs))))
        if entry.confirmed and not own_hooks(module):
            self.hits += 1
            if entry.sig is None:  # hands back some of its arguments, records nothing
                assert entry.template is not None
                return entry.template.arguments(args, kwargs)
            lazies: list[Lazy] = []
            if entry.template is not None and entry.template.handed_back:
                template(args, lazies)  # in the order of inputs
                template(kwargs, lazies)
            return self._add(entry, inputs, lazies)
        if entry.reason is not None or entry.confirmed:
            reason = entry.reason or "it has hooks"
            self.misses[f"{type(module).__name__}: {reason}"] += 1
            return ORIGINAL_CALL(module, *args, **kwargs)
        return self._trace(key, entry, module, args, kwargs, inputs)

    def drop_changed(self) -> None:
        """Drop the entries one of whose modules had an attribute set since the entry was
        made: their next calls are traced with the modules as they are now."""
        suspects, self.epoch = self.watchers.suspects(self.entries, self.epoch)
        for key in suspects:
            entry = self.entries.get(key)
            if entry is not None and entry.reason is None and entry.watch.changed():
                del self.entries[key]

    def entry_for(self, key: Any, module: nn.Module) -> _Entry:
        """The cache entry of ``key``, made (switched off where the module asks) if new."""
        entry = self.entries.get(key)
        if entry is None:
            entry = self.entries[key] = _Entry(module, self.watchers.watch(key, module))
            if self.rec.by_identity:
                entry.read = None
            if any(getattr(m, NO_CACHE, False) for m in module.modules()):
                entry.reason = "switched off with no_cache (it, or a submodule)"
            elif any(own_hooks(m) for m in module.modules()):
                entry.reason = "it or a submodule has hooks"
        return entry

    def _uncached(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A call recorded op by op because an argument is an object the key would hold by
        identity (a config namespace): changed between calls, a cached call would not see it;
        or a call on sequences that takes one value twice."""
        reason = "takes an object that may change between calls (keyed by identity)"
        if not self.rec.mutable_object:
            reason = "takes one value on sequences twice"
        self.misses[f"{type(module).__name__}: {reason}"] += 1
        return ORIGINAL_CALL(module, *args, **kwargs)

    def note_reads(self, entry: _Entry, trace: Trace) -> None:
        """Add what a trace of ``entry``'s call read of tensors from outside (see kept.py)."""
        if entry.read is not None:
            if trace.read_values:
                entry.read = None
            else:
                entry.read.extend(trace.read_tensors)

    def trace_call(
        self,
        module: nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        inputs: list[int],
        lengths: tuple[int, ...] | None = None,
        flags: tuple[int, ...] = (),
    ) -> tuple[Trace, Any]:
        """Call the module, tracing the nodes it records."""
        rec = self.rec
        graph = rec.graph
        start = (graph.node_base + graph.pending) << OUT_BITS
        trace = rec.trace = Trace(inputs, start, lengths, flags)
        template(args, trace.lazies)  # in the order of ``inputs`` (see Recorder.args_key)
        template(kwargs, trace.lazies)
        state = None if dry() else attribute_state(module)  # a dry trace: see still_kept
        held = Held(module if state is None else None, (args, kwargs))
        try:
            result = ORIGINAL_CALL(module, *args, **kwargs)
            if lengths is not None:
                result = plain_result(result)  # x.shape[0] returned: the number
        except TypeError as error:
            if lengths is not None and not dry():
                add_note(error, LENGTH_NOTE.format(name=type(module).__name__, site=user_site()))
            raise
        finally:
            if rec.trace is trace:  # a read inside the call has already stopped it
                rec.trace = None
        if state is not None and (changed := changed_attribute(state)) is not None:
            trace.refuse(f"changes its attribute {changed}, which a cached call would not")
        if held.changed(restore=dry()):  # undone after a dry trace, which then stops
            trace.refuse("changes a list or dict it holds or is given, as a cached call would not")
        self.traced += 1
        return trace, result

    def _trace(
        self,
        key: Any,
        entry: _Entry,
        module: nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        inputs: list[int],
    ) -> Any:
        trace, result = self.trace_call(module, args, kwargs, inputs)
        if trace.aliased:  # recorded op by op; the next call with separate values traces
            self.misses[f"{type(module).__name__}: {ALIASED}"] += 1
            return result
        self.note_reads(entry, trace)
        found = trace.finish(result, self.rec.store.fallbacks, self.rec.graph.views)
        name = type(module).__name__
        if isinstance(found, str):
            entry.reason = found
            self.misses[f"{name}: {found}"] += 1
        elif entry.template is None:
            entry.template = found
        elif found.same_as(entry.template):
            entry.confirmed = True
            if not found.ops:
                return result
            (op, refs, _), *more = found.ops
            derived = self.rec.shared_calls.sources(t for t, _ in op.shared)
            if not more and op.in_metas and all(r[0] == 0 for r in refs) and not derived:
                # one op (not reading W * 2 made from W: Signature.derived): later calls are
                # nodes of that op, batched with the traced ones
                order = [r[1] for r in refs]
                entry.sig = op
                entry.order = None if order == list(range(len(inputs))) else order
                _set_outs(entry, [o for _, _, o in found.outputs])
            else:
                entry.sig = self._signature(name, module, args, kwargs, found)
                _set_outs(entry, list(range(len(found.outputs))))
                keep(key, module, found.ops, entry.sig.shared, entry.read, found)
        else:
            entry.reason = "records different ops on calls with the same arguments"
            self.misses[f"{name}: {entry.reason}"] += 1
        return result

    def _signature(
        self,
        name: str,
        module: nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        found: Template,
    ) -> Signature:
        lazies: list[Lazy] = []
        targs, tkwargs = template(args, lazies), template(kwargs, lazies)
        out_metas = tuple(found.ops[j][0].out_metas[o] for _, j, o in found.outputs)
        sig = self.rec.graph.signature(
            ("macro", id(found)),
            func=module,
            rule=OpRule(name, found.replay),
            name=name,
            template=(targs, tkwargs),
            in_metas=tuple(lazy._meta for lazy in lazies),
            out_metas=out_metas,
            multi=None if found.structure is None else tuple,
            site=user_site(),
        )
        sig.shared = found.shared_now()
        sig.derived = self.rec.shared_calls.sources(t for t, _ in sig.shared)
        sig.set_grad_rule(found.grad_rule)
        sig.set_output_grad(found.node_grad(len(lazies)))
        return sig

    def _add(self, entry: _Entry, inputs: list[int], lazies: Any) -> Any:
        """Record a cached call as one node; ``lazies`` are its lazy arguments, in the order
        of ``inputs`` (read only for those it returns as they are)."""
        rec, sig = self.rec, entry.sig
        assert sig is not None
        if entry.order is not None:
            inputs = [inputs[i] for i in entry.order]
        first = rec.graph.add(sig, inputs, rec.instance)
        single = entry.single
        if single is not None:
            return Lazy(rec, first + single, sig.out_metas[single])
        pair = entry.pair
        if pair is not None:  # ``return h, c``: the commonest call with several outputs
            a, b = pair
            metas = sig.out_metas
            return Lazy(rec, first + a, metas[a]), Lazy(rec, first + b, metas[b])
        return self._outputs(entry, first, lazies)

    def _outputs(self, entry: _Entry, first: int, lazies: Any) -> Any:
        """The lazy outputs of a cached call recorded as the node whose first value is
        ``first``, in the structure the call returns, with the arguments it hands back."""
        rec, sig, template = self.rec, entry.sig, entry.template
        assert sig is not None and template is not None
        metas = sig.out_metas
        outs = [Lazy(rec, first + o, metas[o]) for o in entry.outs]
        for i, j in template.repeats:
            outs[i] = outs[j]
        for position, k in template.handed_back:  # in order of position
            outs.insert(position, lazies[k])
        flat = entry.flat
        if flat is None:
            flat = entry.flat = template.structure == (tuple, (None,) * len(outs))
        return tuple(outs) if flat else build(template.structure, outs)


def _aliases(inputs: list[int]) -> tuple[int, ...] | None:
    """Where each lazy argument first comes, when one comes twice (``m(h, h)``): a forward
    may test ``q is k``, so such a call is keyed apart from ``m(h, g)``."""
    if len(inputs) < 2 or len(set(inputs)) == len(inputs):
        return None
    return tuple(inputs.index(v) for v in inputs)


def _set_outs(entry: _Entry, outs: list[int]) -> None:
    """Which of the node's outputs a confirmed call returns, and the one when it returns one
    tensor (the fast path of :meth:`ModuleCache.hit`)."""
    assert entry.template is not None
    template = entry.template
    entry.outs = outs
    entry.single = outs[0] if template.structure is None else None
    plain = not template.repeats and not template.handed_back
    pair = len(outs) == 2 and template.structure == (tuple, (None, None))
    entry.pair = (outs[0], outs[1]) if plain and pair else None
