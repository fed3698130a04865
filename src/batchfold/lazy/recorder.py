"""The recorder: every PyTorch call inside ``batch_map`` becomes a graph node or runs at once.

:class:`Recorder` is the ``TorchFunctionMode`` active while per-instance code runs. A call
with a lazy argument adds a node (its signature found by key, or made once with its output
shapes inferred on meta tensors); a call on shared tensors only runs at once (memoised so a
result keeps one identity); a factory makes a per-instance constant. ``flush`` schedules and
runs what is pending; ``read`` is a sync point.
"""

from __future__ import annotations

import time
import weakref
from typing import Any

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from ..errors import LAZY_AFTER_RUN, LazyValueError
from ..execute import Executor
from ..graph import OUT_BITS, Graph, Signature
from ..schedule import Scheduler, schedule
from ..stats import Stats
from . import graphs
from .call_keys import CallKeys
from .context import dry, stop_dry
from .dispatch import ORIGINAL_TENSOR
from .dry_trace import dry_signature
from .function import BatchedFunction, refuse_changed
from .lazy_trees import has_lazy, map_lazies
from .lengths import plain_lengths
from .macros import ModuleCache
from .module_state import EPOCH
from .refusals import (
    refuse_channels_last,
    refuse_leaf_copy,
    refuse_weight_grad,
    refuse_write_after_sync,
)
from .running_stats import NORMALISATIONS, RunningStats
from .semantics import META_QUERIES, VIEW_NAMES
from .shared_calls import READ, SharedCalls, refuse_stale
from .signatures import SignatureMaker
from .sites import func_name
from .sizes import read_numbers, read_sizes
from .sources import FACTORIES, SourceMaker, as_itself
from .sync import Driver
from .tensor import Lazy
from .tensor_methods import install_methods
from .traces import Trace
from .writes import InPlaceWrites, index_copies

Tensor = torch.Tensor
_grad_enabled = torch.is_grad_enabled
_inference_mode = torch.is_inference_mode_enabled
_LEADING = ("input", "tensors", "self")  # parameter names that come first when passed by name
_GETTER = type(Tensor.device.__get__)  # what the mode sees for an attribute read of a tensor
_SET_GRAD = torch._C._set_grad_enabled
_PASS = frozenset([_SET_GRAD, Tensor.__int__, Tensor.__float__, Tensor.__bool__, Tensor.item])
install_methods()  # once, before any Lazy is made

_AS_TENSOR = frozenset([torch.as_tensor, torch.asarray])
_UNBIND = frozenset([torch.unbind, Tensor.unbind])
_CASTS_LIKE = frozenset([Tensor.to, Tensor.type_as])  # x.to(other): other's dtype, no operand


def _no_rows(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether an ``unbind`` call's dim has size 0 (``len(shape)``: its own error)."""
    shape: tuple[int, ...] = args[0]._meta.shape
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    return type(dim) is int and -len(shape) <= dim < len(shape) and shape[dim] == 0


_FACTORY_ARGS = frozenset((Tensor, int, float, bool))  # a factory call with these runs at once
_FACTORY_KEYWORDS = frozenset(("dtype", "device", "requires_grad"))  # ... and these keywords


class Recorder(InPlaceWrites, SignatureMaker, CallKeys, TorchFunctionMode):
    """Records the PyTorch calls of one ``batch_map`` into a graph and runs it on demand."""

    moves_running_stats = True  # batch_map moves them after the batch (see running_stats.py)

    def __init__(
        self,
        scheduler: Scheduler = "agenda",
        cache_modules: bool = True,
        ragged: bool = True,
        graph: Graph | None = None,
    ) -> None:
        super().__init__()
        self.ragged = ragged  # batch ops across the lengths of their leading dim
        # a graph given is another front end's; else one kept from this thread's last run
        self.graph, self._context = (graph, None) if graph is not None else graphs.take(ragged)
        self.store = Executor()
        self.scheduler: Scheduler = scheduler
        self.instance = 0
        self.closed = False
        self.stats = Stats()
        self.driver = Driver(self.flush, self._set_instance)
        self.sources = SourceMaker(self)
        self.shared_calls = SharedCalls()
        self._meta_cache: dict[int, tuple[Tensor, Tensor]] = {}
        self.functions: list[tuple[Signature, list[Any], int]] = []
        self._views_of: dict[int, list[weakref.ref[Lazy]]] = {}  # value id -> its lazy views
        self.trace: Trace | None = None  # the module call being traced, if any
        self.modules = ModuleCache(self) if cache_modules else None
        self.running_stats = RunningStats()
        # set when a key holds an object by identity (a tensor, an unhashable or mutable
        # object); the module cache reads it after making a call's key (see kept.py)
        self.by_identity = False

    def _set_instance(self, index: int) -> None:
        self.instance = index

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
        if func in _PASS and not (args and type(args[0]) is Lazy):
            if self.trace is not None and func is not _SET_GRAD:
                self.trace.read_values = True
            return func(*args, **(kwargs or {}))  # grad mode switches, a read value's number
        if type(func) is _GETTER and len(args) == 1 and not kwargs and type(args[0]) is not Lazy:
            # an attribute of a shared tensor (p.device, w.shape): read it at once; a tensor
            # attribute (w.T) goes on to the memo, so that it keeps one identity
            value = func(*args)
            if not isinstance(value, Tensor):
                if self.trace is not None:
                    self.trace.read_tensors.append(args[0])
                return value
        return self.call(func, args, kwargs or {})

    # -- recording ---------------------------------------------------------------------------

    def call(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Record ``func(*args, **kwargs)`` for the current instance; returns lazy output(s).

        A call with no lazy argument runs at once (factories make per-instance constants).
        """
        func, args, kwargs = read_sizes(self, func, args, kwargs)  # torch.zeros(n): n's value
        if not kwargs and self.trace is None and not self.closed:
            known = self.known(func, args)
            if known is not None:
                return known
        if self.closed:
            raise LazyValueError(LAZY_AFTER_RUN.format(what=f"{func_name(func)}()"))
        if func in META_QUERIES and len(args) == 1 and not kwargs and type(args[0]) is Lazy:
            return META_QUERIES[func](args[0])  # x.ndimension(), torch.is_floating_point(x)
        if func in _UNBIND and args and type(args[0]) is Lazy and _no_rows(args, kwargs):
            return ()  # x.unbind() of a sequence of 0 rows: nothing, as eagerly
        if func in NORMALISATIONS:  # in training mode: see running_stats.py
            out = self.running_stats.record(self, func, args, kwargs)
            if out is not None:
                return out
        if func in _AS_TENSOR and args and type(args[0]) is Lazy:
            itself = as_itself(args, kwargs)
            if itself is not None:
                return itself
        if self.trace is not None and self.trace.lengths is not None:  # a ragged call's trace
            args, kwargs = plain_lengths(args), plain_lengths(kwargs)
        if kwargs:
            if not args and (first := next((k for k in _LEADING if k in kwargs), None)):
                kwargs = dict(kwargs)
                args = (kwargs.pop(first),)
            if kwargs.get("inplace") is True or kwargs.get("out") is not None:
                return self._in_place_keyword(func, args, kwargs)
        if func is ORIGINAL_TENSOR and (lazy := self.sources.number(args, kwargs)) is not None:
            return lazy  # torch.tensor(word_id), the common case
        if (
            func in FACTORIES
            and all(type(a) in _FACTORY_ARGS for a in args)
            and (not kwargs or _FACTORY_KEYWORDS.issuperset(kwargs))
        ):  # torch.as_tensor(x, dtype=dtype, device=device), torch.zeros(n)
            return self.sources.make(func, args, kwargs)
        inputs: list[int] = []
        self.by_identity = self.mutable_object = False
        parts = self.args_key(args, inputs)
        if not inputs and func in FACTORIES and not has_lazy((), kwargs):
            return self.sources.make(func, args, kwargs)
        mode = 2 if _inference_mode() else 1 if _grad_enabled() else 0  # grad_mode(), inline
        if kwargs:
            key = (func, parts, self.kwargs_key(kwargs, inputs), mode)
        else:
            key = (func, parts, mode)
        if self.mutable_object and type(func) is BatchedFunction:
            # its node would run with the object as it is when the batch runs: its ops instead
            return func.eager(*args, **kwargs)
        if not inputs:
            return self._eager(func, args, kwargs, key)
        graph = self.graph
        sig = graph.lookup(key)
        if sig is None and dry():  # a dry trace's op of a weight read anew: the kept one's
            sig = dry_signature(key)
        if sig is None:  # in-place calls never get a signature: they record their out-of-place form
            if (operands := self.sources.operand(func, args, kwargs)) is not None:
                return self.call(func, operands, kwargs)
            if func in _CASTS_LIKE and (cast := _cast_like(args, kwargs)) is not None:
                return self.call(Tensor.to, cast, {})
            if (numbers := read_numbers(self, func, args, kwargs)) is not None:
                return self.call(func, *numbers)  # h.unsqueeze(d): d's value, as eagerly
            refuse_channels_last(func, kwargs)
            refuse_weight_grad(func_name(func), args, kwargs)
            refuse_leaf_copy(func_name(func), args, kwargs)
            name = getattr(func, "__name__", "")
            if (name[-1:] == "_" and name[:1] != "_") or name == "__setitem__":  # a write
                return self._in_place_function(func, name, args, kwargs)
            sig = self._signature(key, func, args, kwargs, mode)
            copies = name == "__getitem__" and len(args) > 1 and index_copies(args[-1])
            if name in VIEW_NAMES and not copies:  # x[[0, 2]], x[mask]: copies, as eagerly
                graph.views.add(sig.id)
        first = graph.add(sig, inputs, self.instance)
        if self.trace is not None:
            self.trace.add(sig, inputs, first)
        return self._outputs(sig, first, func, args, kwargs)

    def known(self, func: Any, args: tuple[Any, ...]) -> Any:
        """A call with positional arguments only (``h.sum(0)``, ``torch.cat([h, c])``,
        ``h[:, 0]``) whose signature exists: its lazy output(s) without the general path's
        work, or ``None`` (then the general path, which makes the same key)."""
        inputs: list[int] = []
        parts = self.args_key(args, inputs)  # the general path's key: one way to make it
        mode = 2 if _inference_mode() else 1 if _grad_enabled() else 0  # grad_mode(), inline
        graph = self.graph
        sig = graph.lookup((func, parts, mode))
        if not inputs or sig is None:
            return None
        first = graph.add(sig, inputs, self.instance)
        if sig.multi is None and sig.id not in graph.views:
            return Lazy(self, first, sig.out_metas[0])
        return self._outputs(sig, first, func, args, {})

    def _outputs(
        self, sig: Signature, first: int, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """The lazy output(s) of the node of ``sig`` whose first value is ``first``; a view
        op's are marked as views of its first argument."""
        if sig.multi is None:
            out = Lazy(self, first, sig.out_metas[0])
            if sig.id in self.graph.views:
                self._mark_made((out,), func, args, kwargs)
            return out
        outs = [Lazy(self, first + i, meta) for i, meta in enumerate(sig.out_metas)]
        if sig.id in self.graph.views:
            self._mark_made(outs, func, args, kwargs)
        return tuple(outs) if sig.multi is tuple else sig.multi(outs)

    def _eager(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], key: Any) -> Any:
        """Run a call on shared tensors at once, memoised (see :mod:`.shared_calls`)."""
        if self.running_stats.buffers:  # buffers a training normalisation moves: see there
            self.running_stats.refuse_use((*args, *kwargs.values()), func_name(func))
        if self.driver.syncs:  # instances record out of eager's order from the first sync
            refuse_write_after_sync(self.graph.signatures, func, args)
        result, seen = self.shared_calls.call(func, args, kwargs, key)
        if self.trace is not None and seen:
            if seen == READ:  # w.tolist(), w.dim(): a value read into Python
                self.trace.read_values = True
            else:
                self.trace.refuse(seen)
        return result

    def release(self) -> None:
        """Drop what the run held, once its results and statistics are out.

        The graph, its signatures, the module cache's ragged macros and the recorder refer to
        each other; left as they are, each ``batch_map`` leaves a thousand or so objects that
        only the cyclic garbage collector frees, and the collections they trigger (every
        tenth a larger one, every hundredth one of the whole process) cost more than the
        run's scheduling. Cleared here, reference counting frees them at once. The plan in the
        statistics keeps its steps' signatures.
        """
        self.closed = True
        if self.modules is not None:
            self.modules.release()
        if self._context is not None:
            graphs.give_back(self.graph, self._context)
        self.graph, self.store, self.modules, self.trace = Graph(), Executor(), None, None
        self.shared_calls, self._views_of, self._meta_cache = SharedCalls(), {}, {}
        self.sources.watched, self.sources.arrays, self.sources.eager = [], [], {}  # whole run

    # -- running -------------------------------------------------------------------------------

    def flush(self, needed: np.ndarray | None = None, rehearse: bool = True) -> None:
        """Schedule and run the pending nodes (at the end, those ``needed`` needs: see api)."""
        if not self.graph.pending:
            return
        # gathers, splits and sources run with grad on (each op itself runs in the mode it
        # was recorded in), so values made under enable_grad inside an outer no_grad keep
        # their history, as in eager PyTorch; tensors that need no grad record none
        with torch._C.DisableTorchFunction(), torch.enable_grad():
            self._check_shared_versions()  # with the mode off: a tensor's version is a getter
            self.running_stats.refuse_reads(self.graph)  # see running_stats.py
            start = time.perf_counter()
            first, locations = len(self.store.outputs), self.store.locations
            plan = schedule(self.graph, self.scheduler, first, locations, needed)
            middle = time.perf_counter()
            self.store.run(plan)
            if rehearse and plan.num_nodes < self.graph.pending:  # see Executor.rehearse
                self.store.rehearse(self.graph, self.scheduler, plan)
            end = time.perf_counter()
        self.stats.schedule_s += middle - start
        self.stats.execute_s += end - middle
        self.stats.nodes += plan.num_nodes
        self.stats.unused += self.graph.pending - plan.num_nodes  # see schedule's ``needed``
        self.stats.steps += len(plan.steps)
        self.stats.ragged_steps += sum(step.lengths is not None for step in plan.steps)
        self.stats.segments += 1
        self.stats.plan = plan
        self.graph.clear_pending()
        if self.functions:  # their calls ran: later ones see the modules as they are then
            self.functions = [(sig, modules, EPOCH[0]) for sig, modules, _ in self.functions]

    def move_running_stats(self) -> None:
        """Move the running statistics of normalisations in training mode, once the batch has
        run (see :mod:`.running_stats`)."""
        if self.running_stats.pending:
            with torch._C.DisableTorchFunction():
                vids = [x._vid for x in self.running_stats.lazies()]
                self.running_stats.apply(self.store.values(vids) if vids else [])

    def _check_shared_versions(self) -> None:
        self.sources.check_memory()
        refuse_stale(self.graph)
        refuse_changed(self.functions, self.graph)

    def read(self, lazy: Lazy, what: str, pause: bool = True) -> Tensor:
        """``lazy``'s value: a sync point (see :meth:`wait`)."""
        self.wait(lazy, what, pause)
        with torch._C.DisableTorchFunction(), torch.enable_grad():  # the mode is on: pass it by
            return self.store.value(lazy._vid)

    def read_number(self, lazy: Lazy, what: str) -> Any:
        """``lazy.item()`` of a 0-d value, a sync point as :meth:`read`: the number, read
        without making the value's tensor (``int(logits.argmax())`` in a decoder)."""
        self.wait(lazy, what)
        return self.store.number(lazy._vid)

    def wait(self, lazy: Lazy, what: str, pause: bool = True) -> None:
        """The sync point of a read of ``lazy`` (``what``: ``"int()"``...): until it is
        computed, the instance pauses, or everything pending runs (``pause`` False: at once,
        for a read inside a PyTorch call, which another instance must not enter meanwhile)."""
        if self.closed:
            raise LazyValueError(LAZY_AFTER_RUN.format(what=what))
        if dry():  # a dry trace reads nothing (see dry_trace.py)
            stop_dry(what)
        if self.running_stats.pending:  # see running_stats.py
            self.running_stats.refuse_sync(what)
        if self.trace is not None:  # other instances run while this one waits: stop tracing
            self.trace.refuse("reads a value (a sync point)")
            self.trace = None
        if lazy._vid >> OUT_BITS >= self.graph.node_base:
            if not self.driver.in_instance:
                self.flush()
            elif pause:
                self.driver.pause()  # resumes once every instance waits or is done
            else:
                self.flush()
                self.driver.syncs += 1

    def materialize(self, results: list[Any]) -> list[Any]:
        """Replace every lazy value in a (nested) result by its tensor.

        Values are gathered with one ``index_select`` per step output and then unbound, so
        returning many values stays cheap in the backward pass too. A value that eager PyTorch
        would give ``requires_grad=False`` (see ``Signature.grad_rule``) comes detached, also
        when its step ran rows that require grad. Each result can be written in place as an
        eager one can (see ``Executor.values``); one value returned twice (``return h, h``)
        is one tensor, as eagerly, and one that eagerly is an instance's own tensor
        (``torch.as_tensor(x)`` without a copy) is that tensor; a memoised call on shared
        tensors that several calls got is each instance's own (``SharedCalls.own``).
        ``results``: one per instance.
        """
        vids: list[int] = []
        map_lazies(lambda x: vids.append(x._vid), results, results=True)
        twice = self.shared_calls.handed_twice()
        free = self.graph.grad_free  # values eager gives requires_grad=False: so do these
        unique = list(dict.fromkeys(vids))
        # as in flush: a value keeps the history it was made with; the mode is off for the
        # getters (t.requires_grad)
        with torch._C.DisableTorchFunction(), torch.enable_grad():
            self.sources.check_memory()  # changed after the last run: values read before
            pairs = zip(
                unique, self.store.values(unique, fresh=True) if unique else [], strict=True
            )
            of = {v: t.detach() if t.requires_grad and v in free else t for v, t in pairs}
            of.update((v, self.sources.eager[v]) for v in self.sources.eager.keys() & of.keys())
            values = iter([of[v] for v in vids])
            if not twice:  # the same walk, in the same order
                return map_lazies(lambda _: next(values), results)
            own = self.shared_calls.own_results
            return [own(r, lambda _: next(values), twice) for r in results]


def _cast_like(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    """``x.to(other)`` or ``x.type_as(other)`` as ``x.to(other.dtype)`` when ``other`` is on
    ``x``'s device: ``other`` gives a dtype, it is no operand of the op (nor of its check that
    one op's floating tensors share a dtype)."""
    if len(args) != 2 or kwargs:
        return None
    x, other = (a._meta if type(a) is Lazy else a if isinstance(a, Tensor) else None for a in args)
    if x is None or other is None or x.device != other.device:
        return None
    return args[0], other.dtype
