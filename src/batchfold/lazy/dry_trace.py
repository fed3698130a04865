"""A dry trace: a module call traced with nothing recorded, to check a kept template.

A template kept from an earlier ``batch_map`` (see :mod:`.kept`) is used only if the module
still records the same ops: its forward may read what no snapshot of the module holds (a
global, a class attribute, a closure cell), and a number read there became a constant of the
template. So the first call of a kept key in each ``batch_map`` is traced dry: the forward
runs on the call's lazy arguments (a call on sequences on stand-ins of the lengths the
template was traced at, whose shapes are known) as in a trace, but every node it makes gets
a value id past any real node's and nothing joins the graph's pending nodes. Had the trace
recorded its nodes, they would run as steps of one instance beside the batched ones.

A dry trace must leave nothing behind, and a kept template never reads a value, draws random
numbers, writes into a tensor from outside it or sets a module's attribute; so the trace
stops (:func:`~.context.stop_dry`) before any of these, and the call is traced for real,
which does them as eager code does. Draws of Python's and NumPy's generators, which nothing
can stop, are undone. A forward that raises stops the dry trace too.
"""

from __future__ import annotations

import itertools
import random
from typing import TYPE_CHECKING, Any

import numpy as np
from torch import nn

from ..graph import OUT_BITS, TensorMeta
from .context import DRY_NODES, THREAD, DryStop
from .kept import kept, still_same, unversioned
from .lengths import FIXED, SQUARE, Guard, class_of, guards_hold
from .ragged_templates import RaggedTemplate, ragged_template
from .tensor import Lazy

if TYPE_CHECKING:
    from .macros import ModuleCache
    from .traces import Template


def still_kept(
    cache: ModuleCache,
    key: Any,
    earlier: Template,
    module: nn.Module,
    call: tuple[tuple[Any, ...], dict[str, Any]],
    inputs: list[int],
) -> bool:
    """Whether a dry trace of this call records the ops of ``earlier``, its kept template
    (``key``'s), and leaves the module in the state it was kept in."""
    dry = dry_template(cache, earlier, module, *call, inputs)
    if dry is None or isinstance(dry[0], str) or not still_same(earlier, dry[0]):
        return False
    return kept(key, module) is not None  # a dry trace compares no attributes: see there


def still_ragged(
    cache: ModuleCache,
    key: Any,
    kept_as: tuple[RaggedTemplate, list[Guard], tuple[int, ...]],
    module: nn.Module,
    call: tuple[tuple[Any, ...], dict[str, Any]],
    inputs: list[int],
    flags: tuple[int, ...],
    lengths: tuple[int, ...],
) -> bool:
    """Whether this call on sequences of ``lengths`` meets the guards of its kept template
    (``kept_as``: template, guards, traced lengths) and a dry trace of the call at the traced
    lengths records the template's ops and guards."""
    earlier, guards, traced = kept_as
    if not guards_hold(guards, lengths):
        return False
    dry = dry_template(cache, earlier, module, *call, inputs, traced, flags)
    if dry is None or isinstance(dry[0], str) or dry[1] != guards or dry[0].handed_back:
        return False
    found = ragged_template(dry[0], flags, traced)
    if isinstance(found, str) or not still_same(earlier, found):  # str: now no ragged rule
        return False
    return kept(key, module) is not None  # a dry trace compares no attributes: see there


def dry_template(
    cache: ModuleCache,
    earlier: Template,
    module: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    inputs: list[int],
    lengths: tuple[int, ...] | None = None,
    flags: tuple[int, ...] = (),
) -> tuple[Template | str, Any] | None:
    """The template (or the reason it cannot be one) of ``module(*args, **kwargs)`` traced
    dry, with the trace's guards; ``None`` if the trace stopped or raised. It does not compare
    the module's attributes before and after the call as a real trace does: its caller checks
    the module is still in the state its template was kept in (:func:`~.kept.kept`).

    An op whose signature the graph no longer has (it read a weight, whose version is part of
    its key) takes the kept template's own op of that key but for versions
    (:func:`dry_signature`): signatures are not made for a trace whose nodes never run.

    With ``lengths``, the lazy arguments of ragged inputs (``flags``) are replaced by values
    of those lengths, made for the trace: a kept template is traced at the lengths it was
    traced at, whose output shapes are known (see ``inference_key``), not at the call's."""
    rec = cache.rec
    graph, stats = rec.graph, rec.running_stats
    numbers = itertools.count(DRY_NODES)
    made: list[tuple[int, int]] = []  # each node's first value id and output count
    if lengths is not None:
        twins: list[int] = []
        shapes = iter(_shapes(flags, lengths))
        args, kwargs = _twins((args, kwargs), rec, shapes, numbers, twins)
        if len(twins) != len(inputs) or len(twins) != len(flags):
            return None
        for real, twin in zip(inputs, twins, strict=True):
            made.append((twin, 1))
            if real in graph.grad_free:
                graph.grad_free.add(twin)
        inputs = twins

    def add(sig: Any, ins: Any, instance: int, payload: Any = None) -> int:
        first = next(numbers) << OUT_BITS
        made.append((first, len(sig.out_metas)))
        graph.note_grad_free(sig, ins, first)  # as Graph.add: a forward may read requires_grad
        return first

    def add_source(sig: Any, instance: int, payload: Any) -> int:
        first = add(sig, (), instance)
        graph.grad_free.add(first)
        return first

    traced, moves, moved = cache.traced, len(stats.pending), dict(stats.buffers)
    python_rng, numpy_rng = random.getstate(), np.random.get_state()
    graph.add, graph.add_source = add, add_source  # type: ignore[method-assign]
    THREAD.dry, THREAD.dry_stopped = True, False
    THREAD.dry_ops = _ops_by_key(earlier)
    try:
        trace, result = cache.trace_call(module, args, kwargs, inputs, lengths, flags)
        found = trace.finish(result, rec.store.fallbacks, graph.views)
    except (DryStop, Exception):  # a stop, or the user's error: the real trace meets it
        return None
    finally:
        THREAD.dry, THREAD.dry_ops = False, None
        del graph.add, graph.add_source  # the methods again
        random.setstate(python_rng)  # draws of Python's and NumPy's generators: undone
        np.random.set_state(numpy_rng)
        cache.traced = traced  # nothing was recorded op by op
        del stats.pending[moves:]  # a normalisation in training: never kept, never moved twice
        stats.buffers = moved
        for first, count in made:
            for vid in range(first, first + count):
                graph.grad_free.discard(vid)
                rec._views_of.pop(vid, None)
    if THREAD.dry_stopped:  # stopped, and the forward caught it (except BaseException)
        return None
    return found, trace.guards


def _shapes(flags: tuple[int, ...], lengths: tuple[int, ...]) -> list[Any]:
    """Per input, how to reshape it to ``lengths``: its leading dims' new sizes."""
    out: list[Any] = []
    for flag in flags:
        if flag == FIXED:
            out.append(())
        elif flag == SQUARE:
            out.append((lengths[0], lengths[0]))
        else:
            out.append((lengths[class_of(flag)],))
    return out


def _twins(obj: Any, rec: Any, shapes: Any, numbers: Any, vids: list[int]) -> Any:
    """``obj`` with each lazy value (in the order of ``template``) replaced by one of a dry
    value id and its meta with the leading dims ``shapes`` gives."""
    kind = type(obj)
    if kind is Lazy:
        lead = next(shapes, None)
        if lead is None:
            return obj  # more lazy values than flags: the caller sees the count
        meta = obj._meta
        shape = (*lead, *meta.shape[len(lead) :])
        vid = next(numbers) << OUT_BITS
        vids.append(vid)
        return Lazy(rec, vid, TensorMeta.of(shape, meta.dtype, meta.device))
    if kind is tuple or kind is list:
        return kind(_twins(item, rec, shapes, numbers, vids) for item in obj)
    if kind is dict:
        return {name: _twins(item, rec, shapes, numbers, vids) for name, item in obj.items()}
    return obj


def dry_signature(key: Any) -> Any:
    """In a dry trace, the kept template's op whose key is ``key`` but for the versions of
    the tensors from outside it reads; ``None`` if it has none."""
    found = getattr(THREAD, "dry_ops", None)
    if not found:
        return None
    ops, shared = found
    return ops.get(unversioned(key, shared))


def _ops_by_key(earlier: Template) -> tuple[dict[Any, Any], set[int]]:
    """The ops of a kept template by their keys without versions, and the ids of the tensors
    from outside they read (made once per template: it is kept across calls)."""
    made = getattr(earlier, "_by_key", None)
    if made is None:
        shared = {id(t) for op, _, _ in earlier.ops for t, _ in op.shared}
        made = ({unversioned(op.key, shared): op for op, _, _ in earlier.ops}, shared)
        earlier._by_key = made  # type: ignore[attr-defined]
    return made
