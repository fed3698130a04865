"""The lazy front end's public calls: ``batch_map``, ``function`` and ``last_stats``.

``batch_map`` makes a :class:`~batchfold.lazy.recorder.Recorder`, runs every instance under
it (each in its own greenlet, so reads become sync points), flushes what is left and
replaces lazy results by real tensors. The recorder active in a thread is found with
:func:`active_recorder`, the one door through which other front ends join a running batch.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from typing import Any, Literal, overload

import numpy as np
import torch

from ..errors import LAZY_AFTER_RUN, LazyValueError
from ..graph import OUT_BITS, Signature
from ..profile import Profile
from ..schedule import Scheduler, check_scheduler, gc_paused
from ..stats import Stats
from . import hooks
from .context import active_recorder, active_stack
from .function import BatchedFunction
from .kept import draws_random
from .lazy_trees import map_lazies
from .module_state import attribute_values, settle_attributes
from .recorder import Recorder
from .semantics import is_random
from .tensor import Lazy
from .traces import Template

Tensor = torch.Tensor
_LAST_STATS: list[Stats] = []


@overload
def batch_map(
    fn: Callable[[Any], Any],
    instances: Iterable[Any],
    *,
    scheduler: Scheduler = ...,
    return_stats: Literal[False] = ...,
    cache_modules: bool = ...,
    profile: bool = ...,
    ragged: bool = ...,
) -> list[Any]: ...


@overload
def batch_map(
    fn: Callable[[Any], Any],
    instances: Iterable[Any],
    *,
    scheduler: Scheduler = ...,
    return_stats: Literal[True],
    cache_modules: bool = ...,
    profile: bool = ...,
    ragged: bool = ...,
) -> tuple[list[Any], Stats]: ...


def batch_map(
    fn: Callable[[Any], Any],
    instances: Iterable[Any],
    *,
    scheduler: Scheduler = "agenda",
    return_stats: bool = False,
    cache_modules: bool = True,
    profile: bool = False,
    ragged: bool = True,
) -> list[Any] | tuple[list[Any], Stats]:
    """Run single-instance PyTorch code on many instances as a few batched operations.

    ``fn`` is ordinary code written for one instance. Inside it, tensors the instance makes
    (``torch.tensor(...)``) and everything computed from them are recorded rather than run;
    parameters and other tensors from outside are shared. The recorded graph of all instances
    is then scheduled (``"agenda"``: DyNet's heuristic; ``"depth"``: TensorFlow Fold's) and run
    with one batched call per step.

    Called inside another ``batch_map``'s function, it records into the running batch: it
    returns ``[fn(x) for x in instances]`` with lazy values, batched with everything else.

    Arguments:
        fn: the per-instance function; it may return tensors or nested lists, tuples and dicts
            of them.
        instances: the inputs, one per call of ``fn``.
        scheduler: ``"agenda"`` or ``"depth"``; both give the same values. Agenda batches
            more where one op sits at many depths (per-step recurrences, transition
            systems); depth schedules faster and runs a little faster on trees and on code
            over whole sequences (README, "Which scheduler").
        return_stats: also return the run's :class:`~batchfold.stats.Stats`.
        cache_modules: record each ``nn.Module`` call as one node once two calls with the
            same key recorded the same ops (see :mod:`batchfold.lazy.macros`); ``False``
            records every call op by op.
        profile: time every step, forward and backward, per signature: ``stats.profile``
            (a :class:`~batchfold.profile.Profile`; its backward times fill in once
            ``backward()`` has run).
        ragged: batch ops whose per-instance inputs differ only in the length of their
            leading dim (``[T, d]`` sequences of any ``T``) as one packed step (see
            :mod:`batchfold.ragged`); ``False`` batches only values of equal shapes.

    Returns:
        ``[fn(x) for x in instances]`` with real tensors (and the stats, when asked for).

    Raises:
        ShapeError: an op in ``fn`` got per-instance inputs of shapes it cannot take; the
            message names the file and line.
        DeviceError, DtypeError: one op mixed devices or floating dtypes.
        UnsupportedOpError: an op cannot be recorded (its output shape depends on values, or
            it writes in place where a view would see the write); the message says how to
            write it.

    Example:
        >>> import torch, batchfold as bf
        >>> lin = torch.nn.Linear(2, 3)
        >>> outs, stats = bf.batch_map(lambda x: torch.tanh(lin(torch.tensor(x))),
        ...                            [[1.0, 2.0], [3.0, 4.0]], return_stats=True)
        >>> torch.allclose(outs[1], torch.tanh(lin(torch.tensor([3.0, 4.0]))))
        True
        >>> stats.nodes, stats.steps
        (6, 3)
    """
    if "torch._dynamo" in sys.modules and torch.compiler.is_compiling():
        # called from code torch.compile traces: run as a call it does not trace
        eager: Any = torch.compiler.disable(batch_map, recursive=True)
        return eager(
            fn,
            instances,
            scheduler=scheduler,
            return_stats=return_stats,
            cache_modules=cache_modules,
            profile=profile,
            ragged=ragged,
        )
    check_scheduler(scheduler)
    outer = active_recorder()
    if outer is not None and outer.driver.in_instance:
        if return_stats:
            raise ValueError(
                "return_stats=True in a batch_map nested in another one: the "
                "inner calls join the outer batch; ask the outer call for stats"
            )
        return [fn(x) for x in instances]
    # under autocast, values batch by shape: ragged rules compute some ops (a weighted sum of
    # rows for a matmul) with other kernels than autocast's, and other dtypes
    autocast = torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda")
    rec = Recorder(scheduler, cache_modules, ragged and not autocast)
    if profile:
        rec.store.profile = Profile()
    start = time.perf_counter()
    active = active_stack()
    hooks.install()
    active.append(rec)
    try:
        with gc_paused():
            try:
                with rec:
                    results = rec.driver.run(fn, instances)
                    if isinstance(instances, list) and len(instances) > len(results):
                        raise ValueError(
                            f"the list of instances grew to {len(instances)} while batch_map "
                            f"ran its {len(results)}: an instance resumed from a sync point "
                            "added to it after the last one had started. Give batch_map a "
                            "list that does not change while it runs."
                        )
                    rec.stats.instances = len(results)
                    rec.flush(*_read_at_the_end(rec, results))
                    rec.move_running_stats()
                    outputs = rec.materialize(results)
                    settle_attributes(rec, rec.materialize)
                stats = _final_stats(rec, start)
            finally:
                settle_attributes(rec, None)  # what a failed run left
                rec.release()  # before the collector is back on: see Recorder.release
    finally:
        active.remove(rec)
        hooks.uninstall()
    _LAST_STATS[:] = [stats]
    return (outputs, stats) if return_stats else outputs


def _read_at_the_end(rec: Recorder, results: list[Any]) -> tuple[np.ndarray, bool]:
    """The value ids read once the last segment has run: the results, the running statistics
    of normalisations in training, and module attributes set to lazy values, and every node
    that may draw random numbers (drawn or not, a draw moves the generator: later draws would
    differ from eager's); and whether the unused values may be run once more (none draws).

    The last plan leaves out the nodes none of them needs: eagerly, a value nothing refers to
    is gone, and it takes no part in the backward pass, where batched its rows would (a
    non-finite local derivative of an unused value, times its zero gradient, made a shared
    weight's NaN). They run once more on their own, for eager's errors (``Executor.rehearse``),
    unless a node may draw (the draws would move the generator twice)."""
    vids: list[int] = []

    def own(x: Lazy) -> None:  # one an earlier run recorded names a node of its own graph
        if x._rec is not rec:
            raise LazyValueError(LAZY_AFTER_RUN.format(what="return"))
        vids.append(x._vid)

    map_lazies(own, results, results=True)
    vids += [x._vid for x in (*rec.running_stats.lazies(), *attribute_values(rec))]
    graph, draws = rec.graph, False
    for sig_id in graph.touched:
        if _may_draw(graph.signatures[sig_id]):
            vids += [node << OUT_BITS for node in graph.pending_of[sig_id].nodes]
            draws = True
    return np.asarray(vids, dtype=np.int64), not draws


def _may_draw(sig: Signature) -> bool:
    """Whether a node of ``sig`` may draw random numbers: a random op, a module call whose
    traced ops draw, or a ``bf.function`` (whose code may)."""
    if is_random(sig.func) or type(sig.func) is BatchedFunction:
        return True
    for replay in (sig.rule.batched if sig.rule else None, sig.family and sig.family.replay):
        template = getattr(replay, "__self__", None)  # a module call's: Template.replay
        if isinstance(template, Template) and draws_random(template.ops):
            return True
    return False


def _final_stats(rec: Recorder, start: float) -> Stats:
    """The run's statistics, from the recorder's parts, before it releases them."""
    stats = rec.stats
    stats.fallbacks = dict(rec.store.fallbacks.counts)
    stats.syncs = rec.driver.syncs
    if rec.modules is not None:
        stats.module_calls_cached = rec.modules.hits
        stats.module_calls_traced = rec.modules.traced
        stats.module_misses = dict(rec.modules.misses)
    stats.record_s = time.perf_counter() - start - stats.schedule_s - stats.execute_s
    if rec.store.profile is not None:
        stats.profile = rec.store.profile
        stats.profile.phases = {
            "record": stats.record_s,
            "schedule": stats.schedule_s,
            "execute": stats.execute_s,
        }
    return stats


def last_stats() -> Stats | None:
    """The statistics of the most recent ``batch_map`` call in this process."""
    return _LAST_STATS[0] if _LAST_STATS else None
