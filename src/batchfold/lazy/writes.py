"""In-place writes inside ``batch_map``: each is recorded as its op's out-of-place form.

``x.add_(y)``, ``torch.relu(x, inplace=True)``, ``torch.add(a, b, out=x)`` and ``x[i] = v`` on
a lazy tensor record the out-of-place op and rebind the same Python object to its result
(cast to the target's dtype, as eager in-place ops cast). Views are tracked so that a write
eager PyTorch would make visible through a view (into a view of a live value, or into a value
with live views) is refused with an error rather than giving other numbers. A write into a
tensor from outside ``batch_map`` is refused too.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..errors import LAZY_AFTER_RUN, DtypeError, LazyValueError, ShapeError, UnsupportedOpError
from ..graph import OUT_BITS
from .context import DRY_NODES, dry, stop_dry
from .function import BatchedFunction
from .inference import template
from .lazy_trees import has_lazy
from .refusals import REFUSED
from .semantics import VIEW_NAMES, VIEWS_OF_EVERY_ARGUMENT, base_name, in_place_form
from .sites import func_name, inside_torch, user_site
from .tensor import Lazy

if TYPE_CHECKING:
    from ..graph import Graph
    from .shared_calls import SharedCalls
    from .sources import SourceMaker
    from .traces import Trace


_DTYPE_VIEWS = frozenset(("real", "imag", "view_as_real", "view_as_complex", "view"))
"""View ops whose output may have another dtype than their input and still share its memory."""


class InPlaceWrites:
    """The recorder's handling of in-place writes (a base class of ``Recorder``).

    It uses the recorder's ``call`` (to record the out-of-place op), ``trace`` (a module call
    being traced refuses writes into tensors from outside it), ``_views_of`` (value id ->
    weak references to the lazy tensors that may view it) and ``shared_calls`` (the memo of calls
    on tensors from outside, told of every write into one of them).
    """

    _views_of: dict[int, list[weakref.ref[Lazy]]]
    shared_calls: SharedCalls
    trace: Trace | None
    graph: Graph
    sources: SourceMaker

    if TYPE_CHECKING:

        def call(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            """Record one call (the recorder's)."""
            ...

    def _mark_made(self, outs: Any, func: Any, args: Any, kwargs: Any) -> None:
        """Mark the outputs of a view op as views of its first argument, and those of a
        ``bf.function`` whose code shares memory between what it takes and gives (see
        ``BatchedFunction.eager_for_shapes``) as views of every lazy argument and of each other:
        a write into one of them is refused while another is in use."""
        if type(func) is not BatchedFunction:
            if base_name(func) not in VIEWS_OF_EVERY_ARGUMENT:
                self._mark_views(outs, args[0], base_name(func) in _DTYPE_VIEWS)
                return
            bases: list[Lazy] = []  # torch.einsum("ij->ji", x), torch.broadcast_tensors(x, y)
            template((args, kwargs), bases)
            for base in bases:
                self._mark_views(outs, base)
            return
        lazies: list[Lazy] = []
        template(args, lazies)
        template(kwargs, lazies)
        related = {id(x): x for x in (*lazies, *outs)}
        refs = {k: weakref.ref(x) for k, x in related.items()}
        for out in outs:
            out._view = tuple(r for k, r in refs.items() if k != id(out))
        for k, x in related.items():
            self._views_of.setdefault(x._vid, []).extend(refs[id(o)] for o in outs if id(o) != k)

    def _mark_views(self, outs: Any, base: Any, dtype_view: bool = False) -> None:
        """Note that ``outs`` may share memory with ``base`` and with what ``base`` views
        (``dtype_view``: a view as another dtype, ``x.real``, ``x.view(torch.int32)``)."""
        if type(base) is not Lazy:
            return
        above = base._view
        chain = (weakref.ref(base), *above) if above else (weakref.ref(base),)
        refs = []
        for out in outs:
            out._view = chain if out._view is None else (*out._view, *chain)
            refs.append(weakref.ref(out))
        views_of = self._views_of
        views_of.setdefault(base._vid, []).extend(refs)
        memory = self.sources.instance_memory
        if base._vid in memory:  # a view of an instance's own tensor is its memory too
            # (a cast to another dtype, x.double(), is a copy; x.real is not)
            same = base._meta.dtype
            memory.update(o._vid for o in outs if dtype_view or o._meta.dtype == same)
        for ancestor in above or ():
            if (alive := ancestor()) is not None:
                views_of.setdefault(alive._vid, []).extend(refs)

    def write(
        self, target: Lazy, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], what: str
    ) -> Lazy:
        """Record an in-place write into ``target`` as ``func``'s out-of-place result.

        ``target`` (the same Python object) is rebound to the result, cast to its dtype as
        eager in-place ops cast. A write that eager PyTorch would make visible through a view
        (into a view of a live value, or into a value that has live views) is refused.
        """
        if target._rec is not self:
            raise LazyValueError(LAZY_AFTER_RUN.format(what=what))
        if target._vid >> OUT_BITS < DRY_NODES and dry():  # rebinding the caller's value
            stop_dry(what)
        if self.trace is not None and target._vid < self.trace.start:
            self.trace.refuse("writes in place into a tensor from outside the call")
        self._check_aliases(target, what)
        if target._vid in self.sources.instance_memory:
            raise UnsupportedOpError(
                f"{what} at {user_site()} writes in place into an instance's own tensor: "
                "torch.as_tensor(x) made no copy, so eager PyTorch would change x itself (and "
                "every instance sharing it), which batch_map does not. Copy it first, "
                "torch.as_tensor(x).clone() or torch.tensor(x), or write out of place."
            )
        grad_on, free = torch.is_grad_enabled(), self.graph.grad_free
        if not grad_on and target._vid not in free:
            raise UnsupportedOpError(
                f"{what} at {user_site()} writes in place, outside grad mode, into a lazy "
                "tensor that requires grad. Eager PyTorch leaves such a write out of the "
                "gradient (gradients flow through the tensor as if it were unchanged); "
                "batch_map records the write as a new value and cannot. Write it in grad mode, "
                "or into a detached tensor: x = x.detach() first."
            )
        result = self.call(func, args, kwargs)
        if type(result) is not Lazy:
            raise UnsupportedOpError(f"{what} at {user_site()} does not give one tensor")
        if result._meta.shape != target._meta.shape:
            name = base_name(func)  # the out-of-place form recorded for the write
            if name in VIEW_NAMES or name == "resize":  # x.unsqueeze_(0), x.t_(): valid eagerly
                raise UnsupportedOpError(
                    f"{what} at {user_site()} changes the tensor's shape in place, which "
                    f"batch_map does not record; rebind it instead: x = x.{name}(...)"
                )
            raise ShapeError(
                f"{what} at {user_site()}: the result's shape {tuple(result.shape)} does not "
                f"match the shape {tuple(target.shape)} of the tensor written in place"
            )
        if result.dtype != target.dtype:
            if not torch.can_cast(result.dtype, target.dtype):
                raise DtypeError(
                    f"{what} at {user_site()}: result type {result.dtype} can't be cast to the "
                    f"desired output type {target.dtype} (as in eager PyTorch)"
                )
            result = self.call(torch.Tensor.to, (result, target.dtype), {})
        # eager's target keeps its requires_grad through a write outside grad mode (none, as
        # checked), and through zero_() or fill_() in grad mode: those record zeros_like or
        # full_like, which require none, so the new value is picked by a where from the target
        if not grad_on:
            free.add(result._vid)
        elif target._vid not in free and result._vid in free:
            keep = self.call(torch.ones_like, (target,), {"dtype": torch.bool})
            result = self.call(torch.where, (keep, result, target), {})
        target._vid, target._meta = result._vid, result._meta
        return target

    def _check_aliases(self, target: Lazy, what: str) -> None:
        if target._view and any(ref() is not None for ref in target._view):
            raise UnsupportedOpError(
                f"{what}{inside_torch()} at {user_site()} writes into a view of another lazy "
                "tensor. Inside batch_map a write does not reach the tensor it views. Build the "
                "new value out of place, e.g. x = torch.cat([x[:i], v, x[i + 1:]]), or "
                "assign into the whole tensor: x[0, 1] = v instead of x[0][1] = v, and "
                "x[i] = x[i] + v instead of x[i] += v."
            )
        views = self._views_of.get(target._vid)
        if views and any(ref() is not None for ref in views):
            raise UnsupportedOpError(
                f"{what}{inside_torch()} at {user_site()} changes a lazy tensor in place while a "
                "view of it (from indexing, view, reshape, chunk, ...) is still in use; inside batch_map "
                "that view would keep the old values. Take the view after the write, or write "
                "out of place: x = x + 1 instead of x += 1."
            )

    def unsupported_in_place(self, name: str) -> UnsupportedOpError:
        """The error for an in-place method with no out-of-place form to record."""
        return UnsupportedOpError(
            f"in-place {name} at {user_site()} has no out-of-place form to record; compute a "
            "new tensor instead"
        )

    def _in_place_function(
        self, func: Any, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        form = in_place_form(func, args, kwargs)
        target = args[0] if args else None
        if type(target) is not Lazy:
            raise UnsupportedOpError(
                f"{name} at {user_site()} writes per-instance values into a tensor from "
                "outside batch_map; compute a new tensor instead, e.g. y = x + v"
            )
        if name == "detach_":  # torch.detach_(x): x.detach_() is refused on Lazy itself
            raise UnsupportedOpError(f"detach_ of a lazy tensor at {user_site()}: {REFUSED[name]}.")
        if not form:
            raise self.unsupported_in_place(name)
        return self.write(target, form, args, kwargs, f"{name}()")

    def _in_place_keyword(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A call with ``inplace=True`` or ``out=``: a write into the lazy tensor named."""
        name = func_name(func)
        if kwargs.get("inplace") is True:
            rest = {**kwargs, "inplace": False}
            if args and type(args[0]) is Lazy:
                return self.write(args[0], func, args, rest, f"{name}(..., inplace=True)")
            if has_lazy(args, kwargs):
                raise UnsupportedOpError(
                    f"{name}(..., inplace=True) at {user_site()} writes per-instance values "
                    "into a tensor from outside batch_map; use inplace=False"
                )
            if args and isinstance(args[0], torch.Tensor):
                self.shared_calls.written(args[0], func)
            return func(*args, **kwargs)
        out = kwargs["out"]
        rest = {k: v for k, v in kwargs.items() if k != "out"}
        if type(out) is Lazy:
            return self.write(out, func, args, rest, f"{name}(..., out=...)")
        if has_lazy(args, kwargs):
            raise UnsupportedOpError(
                f"{name}(..., out=...) at {user_site()}: out= must be a lazy tensor made "
                "inside the function to take per-instance values; write y = "
                f"torch.{name}(...) instead"
            )
        for target in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(target, torch.Tensor):
                self.shared_calls.written(target, func)
        return func(*args, **kwargs)


def index_copies(index: Any) -> bool:
    """Whether ``x[index]`` is a copy in eager PyTorch (advanced indexing: a list of numbers,
    an array or a tensor of one or more dims, a mask, a Python bool), not a view; anything
    else counts as a view (a 0-d integer array or tensor is one), which at worst makes a
    later write through it refused."""
    for item in index if type(index) is tuple else (index,):
        if type(item) is bool:
            return True
        if type(item) is list:  # of numbers only: one holding a slice or a tensor is a tuple
            if item and all(isinstance(i, (int, np.integer, np.bool_)) for i in item):
                return True
            continue
        if isinstance(item, np.ndarray):
            if item.ndim > 0 or item.dtype == np.bool_:
                return True
            continue
        tensor = hasattr(item, "dim") and getattr(item, "dtype", None) is not None  # or lazy
        if tensor and (item.dim() > 0 or item.dtype in (torch.bool, torch.uint8)):
            return True
    return False
