"""The lazy front end: single-instance PyTorch code, recorded per instance, run batched.

``batch_map(fn, instances)`` runs ``fn`` on each instance under a
``TorchFunctionMode``. Tensors that an instance creates, and everything computed from them,
are :class:`Lazy`: each PyTorch call on them adds a node to the :class:`~batchfold.graph.Graph`
instead of computing. Tensors from outside (parameters, buffers) are shared by identity.
When every instance has been recorded, ``schedule`` and ``execute`` run the graph, and the
lazy results are replaced by real tensors that autograd can differentiate.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any, Literal, overload

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

from .errors import (
    LAZY_AFTER_RUN,
    DeviceError,
    DtypeError,
    LazyValueError,
    ShapeError,
    UnsupportedOpError,
)
from .execute import Store
from .graph import OUT_BITS, Graph, Signature, Slot, TensorMeta
from .ops import OpRule, rule_for
from .schedule import Scheduler, schedule
from .stats import Stats
from .sync import Driver

Tensor = torch.Tensor
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_ACTIVE: list[Recorder] = []
_LAST_STATS: list[Stats] = []

FACTORIES = frozenset(
    getattr(torch, name)
    for name in (
        "tensor",
        "as_tensor",
        "from_numpy",
        "zeros",
        "ones",
        "full",
        "empty",
        "eye",
        "arange",
        "linspace",
        "rand",
        "randn",
        "randint",
        "randperm",
        "zeros_like",
        "ones_like",
        "full_like",
        "empty_like",
        "rand_like",
        "randn_like",
        "bernoulli",
        "normal",
    )
)
_SCALAR_DTYPES: dict[type, torch.dtype | None] = {int: torch.int64, bool: torch.bool, float: None}


class Lazy:
    """A per-instance tensor inside ``batch_map``: known shape and dtype, value not yet computed.

    It supports the ``torch.Tensor`` API: functions, methods and operators are recorded,
    and ``shape``, ``dtype``, ``device``, ``dim()`` and ``size()`` answer at once.
    """

    __slots__ = ("_rec", "_vid", "_meta")

    def __init__(self, rec: Recorder, vid: int, meta: TensorMeta) -> None:
        self._rec, self._vid, self._meta = rec, vid, meta

    @property
    def shape(self) -> torch.Size:
        """The shape of one instance's value."""
        return self._meta.size

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the value."""
        return self._meta.dtype

    @property
    def device(self) -> torch.device:
        """The device the value will live on."""
        return self._meta.device

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
        lazy = _first_lazy((args, kwargs))
        return lazy._rec.call(func, args, kwargs or {})

    def __repr__(self) -> str:
        return f"Lazy({self._meta}, value {self._vid})"

    __hash__ = object.__hash__

    @property
    def ndim(self) -> int:
        """Number of dimensions of one instance's value."""
        return len(self.shape)

    def dim(self) -> int:
        """Number of dimensions of one instance's value."""
        return len(self.shape)

    def size(self, dim: int | None = None) -> Any:
        """The shape, or the length of dimension ``dim``."""
        return self.shape if dim is None else self.shape[dim]

    def numel(self) -> int:
        """Number of elements of one instance's value."""
        return self.shape.numel()

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d lazy tensor")
        return self.shape[0]

    def is_floating_point(self) -> bool:
        """Whether the dtype is a floating-point type."""
        return self.dtype.is_floating_point

    @property
    def is_cuda(self) -> bool:
        """Whether the value will live on a CUDA device."""
        return self.device.type == "cuda"

    @property
    def requires_grad(self) -> bool:
        """Gradients flow through lazy values like through any tensor."""
        return self.dtype.is_floating_point

    @property
    def T(self) -> Lazy:  # noqa: N802
        """The transpose (all dims reversed)."""
        return self._rec.call(torch.Tensor.permute, (self, *reversed(range(self.ndim))), {})

    @property
    def mT(self) -> Lazy:  # noqa: N802
        """The transpose of the last two dims."""
        return self._rec.call(torch.Tensor.transpose, (self, -2, -1), {})

    def __iter__(self):  # noqa: ANN204
        return iter(self._rec.call(torch.Tensor.unbind, (self, 0), {}))

    def __setitem__(self, index: Any, value: Any) -> None:
        updated = self._rec.call(_setitem, (self, index, value), {})
        self._rebind(updated)

    def _rebind(self, other: Lazy) -> None:
        self._vid, self._meta = other._vid, other._meta

    def _read(self, what: str) -> Tensor:
        return self._rec.read(self, what)

    def item(self) -> Any:
        """Compute the value (a sync point) and return it as a Python number."""
        return self._read("item()").item()

    def tolist(self) -> Any:
        """Compute the value (a sync point) and return it as (nested) Python lists."""
        return self._read("tolist()").tolist()

    def __bool__(self) -> bool:
        return bool(self._read("bool()"))

    def __int__(self) -> int:
        return int(self._read("int()"))

    def __float__(self) -> float:
        return float(self._read("float()"))

    def __index__(self) -> int:
        return self._read("an index").__index__()

    def numpy(self) -> Any:
        """Compute the value (a sync point) and return it as a NumPy array."""
        return self._read("numpy()").detach().numpy()


def _setitem(x: Tensor, index: Any, value: Any) -> Tensor:
    """``x[index] = value`` without changing ``x``: the functional form of item assignment."""
    x = x.clone()
    x[index] = value
    return x


_NOT_RECORDED = {
    "__init__",
    "__new__",
    "__class__",
    "__getattribute__",
    "__setattr__",
    "__delattr__",
    "__repr__",
    "__str__",
    "__format__",
    "__hash__",
    "__reduce__",
    "__reduce_ex__",
    "__setstate__",
    "__getstate__",
    "__dir__",
    "__sizeof__",
    "__init_subclass__",
    "__subclasshook__",
    "__torch_function__",
    "__torch_dispatch__",
    "__deepcopy__",
    "__array__",
    "__array_wrap__",
    "__array_priority__",
    "__dlpack__",
    "__dlpack_device__",
    "__contains__",
    "__iter__",
    "__len__",
    "__bool__",
    "__int__",
    "__float__",
    "__index__",
    "__complex__",
    "__long__",
    "__nonzero__",
    "__setitem__",
    "__delitem__",
    "__reversed__",
    "__cuda_array_interface__",
    "__weakref__",
    "__module__",
    "__doc__",
    "__slots__",
    "__iadd__",
    "__isub__",
    "__imul__",
    "__itruediv__",
    "__ifloordiv__",
    "__imod__",
    "__ipow__",
    "__iand__",
    "__ior__",
    "__ixor__",
    "__ilshift__",
    "__irshift__",
    "__imatmul__",
    "backward",
    "register_hook",
    "retain_grad",
    "data_ptr",
    "storage",
    "untyped_storage",
    "new_tensor",
    "new_zeros",
    "new_ones",
    "new_empty",
    "new_full",
}


def _method(name: str) -> Callable[..., Any]:
    func = getattr(torch.Tensor, name)
    if name.endswith("_") and not name.startswith("_"):
        out_of_place = getattr(torch.Tensor, name[:-1], None)

        def in_place(self: Lazy, *args: Any, **kwargs: Any) -> Lazy:
            if out_of_place is None:
                raise UnsupportedOpError(f"in-place {name} has no out-of-place form to record")
            self._rebind(self._rec.call(out_of_place, (self, *args), kwargs))
            return self

        return in_place

    def method(self: Lazy, *args: Any, **kwargs: Any) -> Any:
        return self._rec.call(func, (self, *args), kwargs)

    method.__name__ = name
    return method


for _name in dir(torch.Tensor):
    if _name in _NOT_RECORDED or _name in Lazy.__dict__ or _name in ("shape", "dtype", "device"):
        continue
    if callable(getattr(torch.Tensor, _name, None)) and not isinstance(
        getattr(torch.Tensor, _name), type
    ):
        setattr(Lazy, _name, _method(_name))


def _first_lazy(tree: Any) -> Lazy:
    stack = [tree]
    while stack:
        item = stack.pop()
        if type(item) is Lazy:
            return item
        if isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
    raise AssertionError("no lazy value among the arguments")


def _has_lazy(args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> bool:
    for a in args:
        if type(a) is Lazy:
            return True
        if type(a) in (list, tuple) and any(type(b) is Lazy for b in a):
            return True
    return bool(kwargs) and any(
        type(v) is Lazy or (type(v) in (list, tuple) and any(type(b) is Lazy for b in v))
        for v in kwargs.values()  # type: ignore[union-attr]
    )


def user_site() -> str:
    """``file:line`` of the innermost caller outside batchfold and PyTorch."""
    frame = sys._getframe(1)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith((_PACKAGE_DIR, _TORCH_DIR)) or "/tests/" in path:
            return f"{frame.f_code.co_filename}:{frame.f_lineno} (in {frame.f_code.co_name})"
        frame = frame.f_back
    return "<unknown>"


def func_name(func: Any) -> str:
    """A short readable name for a PyTorch function, method or batched function."""
    name = getattr(func, "__name__", None) or type(func).__name__
    return name.strip("_") if name.startswith("__") else name


class Recorder(TorchFunctionMode):
    """Records the PyTorch calls of one ``batch_map`` into a graph and runs it on demand."""

    def __init__(self, scheduler: Scheduler = "agenda") -> None:
        super().__init__()
        self.graph = Graph()
        self.store = Store()
        self.scheduler: Scheduler = scheduler
        self.instance = 0
        self.closed = False
        self.stats = Stats()
        self.driver = Driver(self.flush, self._set_instance)
        self._memo: dict[tuple[Any, ...], Tensor] = {}
        self._meta_tensors: dict[int, tuple[Tensor, Tensor]] = {}
        self._scalar_sources: dict[tuple[Any, ...], tuple[Signature, TensorMeta]] = {}

    def _set_instance(self, index: int) -> None:
        self.instance = index

    # -- the mode: every PyTorch call inside batch_map comes here --------------------------

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
        return self.call(func, args, kwargs or {})

    def _eager(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], key: Any) -> Any:
        """Run a call on shared tensors at once, memoised so that its result keeps one identity.

        ``W.t()`` called by every instance must be the same tensor each time, or the nodes
        that read it would get different signatures and never batch.
        """
        name = getattr(func, "__name__", "")
        if name.endswith("_") or name in ("__get__", "__set__", "__setitem__"):
            return func(*args, **kwargs)
        try:
            result = self._memo.get(key)
        except TypeError:  # an unhashable constant among the arguments
            return func(*args, **kwargs)
        if result is None:
            result = func(*args, **kwargs)
            if isinstance(result, Tensor):
                self._memo[key] = result
        return result

    # -- recording ---------------------------------------------------------------------------

    def call(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Record ``func(*args, **kwargs)`` for the current instance; returns lazy output(s).

        A call with no lazy argument runs at once (factories make per-instance constants).
        """
        if self.closed:
            raise LazyValueError(LAZY_AFTER_RUN.format(what=f"{func_name(func)}()"))
        inputs: list[int] = []
        parts = []
        for a in args:  # the key of the arguments; inline for the common flat case
            kind = type(a)
            if kind is Lazy:
                if a._rec is not self:
                    raise LazyValueError(LAZY_AFTER_RUN.format(what="use"))
                inputs.append(a._vid)
                parts.append(a._meta)
            elif isinstance(a, Tensor):
                parts.append(id(a))  # shared, by identity; the signature keeps it alive
            else:
                parts.append(self._key(a, inputs))
        if not inputs and func in FACTORIES and not _has_lazy((), kwargs):
            return self.source(func, args, kwargs)
        if kwargs:
            if kwargs.get("inplace"):
                kwargs = {**kwargs, "inplace": False}
            key = (func, tuple(parts), self._key(kwargs, inputs))
        else:
            key = (func, tuple(parts))
        if not inputs:
            return self._eager(func, args, kwargs, key)
        sig = self.graph.lookup(key)
        if sig is None:
            sig = self._signature(key, func, args, kwargs)
        first = self.graph.add(sig, inputs, self.instance)
        if sig.multi is None:
            return Lazy(self, first, sig.out_metas[0])
        outs = [Lazy(self, first + i, meta) for i, meta in enumerate(sig.out_metas)]
        return tuple(outs) if sig.multi is tuple else sig.multi(outs)

    def source(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run a factory and make its result a lazy per-instance constant.

        ``torch.tensor(x)`` of a Python number keeps just the number: the batched step builds
        one tensor from all of them.
        """
        scalar = func is torch.tensor and len(args) == 1 and type(args[0]) in _SCALAR_DTYPES
        cache_key = None
        if scalar and not kwargs.keys() - {"dtype", "device"}:
            # the common case, torch.tensor(word_id): one signature per kind of number
            cache_key = (
                type(args[0]),
                torch.get_default_dtype(),
                kwargs.get("dtype"),
                kwargs.get("device"),
            )
            cached = self._scalar_sources.get(cache_key)
            if cached is not None:
                return Lazy(self, self.graph.add(cached[0], (), self.instance, args[0]), cached[1])
            dtype = (
                kwargs.get("dtype") or _SCALAR_DTYPES[type(args[0])] or torch.get_default_dtype()
            )
            meta = TensorMeta.of((), dtype, torch.device(kwargs.get("device") or "cpu"))
            kind, payload = "scalar", args[0]
        else:
            value = func(*args, **kwargs)
            if not isinstance(value, Tensor):
                return value
            meta = TensorMeta.of(tuple(value.shape), value.dtype, value.device)
            kind, payload = "tensor", value
        key = ("source", meta, kind)
        sig = self.graph.lookup(key)
        if sig is None:
            # the template's one element tells the executor how to build the batch
            sig = self.graph.signature(
                key, func, _SOURCE, func_name(func), ((kind,), {}), (), (meta,), None, user_site()
            )
        if cache_key is not None:
            self._scalar_sources[cache_key] = (sig, meta)
        return Lazy(self, self.graph.add(sig, (), self.instance, payload), meta)

    def _key(self, obj: Any, inputs: list[int]) -> Any:
        """A hashable key for an argument; appends the value ids of lazy inputs, in order."""
        kind = type(obj)
        if kind is Lazy:
            if obj._rec is not self:
                raise LazyValueError(LAZY_AFTER_RUN.format(what="use"))
            inputs.append(obj._vid)
            return obj._meta
        if kind is tuple or kind is list:
            return (kind, *[self._key(item, inputs) for item in obj])
        if kind is dict:
            return (dict, *[(name, self._key(item, inputs)) for name, item in obj.items()])
        if isinstance(obj, Tensor):
            return id(obj)  # shared, by identity; the signature keeps it alive
        if kind is int or kind is float or kind is bool:
            return (kind, obj)
        if kind is slice:
            return (slice, obj.start, obj.stop, obj.step)
        try:
            hash(obj)
        except TypeError:
            return ("object", id(obj))
        return obj

    def _signature(
        self, key: tuple[Any, ...], func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Signature:
        """Make the signature of a new kind of node: template, rule, output shapes, checks."""
        lazies: list[Lazy] = []
        targs, tkwargs = _template(args, lazies), _template(kwargs, lazies)
        in_metas = tuple(lazy._meta for lazy in lazies)
        site = user_site()
        name = func_name(func)
        device = _check_inputs(name, site, in_metas, (targs, tkwargs))
        rule = (
            func.rule
            if isinstance(func, BatchedFunction)
            else rule_for(func, targs, tkwargs, in_metas)
        )
        out = self._infer(func, name, site, targs, tkwargs, in_metas, device)
        multi = None if isinstance(out, Tensor) else type(out)
        outs = (out,) if isinstance(out, Tensor) else tuple(out)
        out_metas = tuple(TensorMeta.of(tuple(o.shape), o.dtype, device) for o in outs)
        return self.graph.signature(
            key, func, rule, name, (targs, tkwargs), in_metas, out_metas, multi, site
        )

    def _infer(
        self,
        func: Any,
        name: str,
        site: str,
        targs: Any,
        tkwargs: Any,
        in_metas: tuple[TensorMeta, ...],
        device: torch.device,
    ) -> Any:
        """Output(s) of one call, computed on meta tensors (or on zeros where meta fails)."""
        from .ops import fill

        with torch._C.DisableTorchFunction():
            out = None
            if not isinstance(func, BatchedFunction):
                metas = [torch.empty(m.shape, dtype=m.dtype, device="meta") for m in in_metas]
                try:
                    out = func(
                        *fill(self._to_meta(targs), metas), **fill(self._to_meta(tkwargs), metas)
                    )
                except NotImplementedError:
                    out = None
                except Exception as error:
                    if "meta" not in str(error).lower():
                        raise _shape_error(name, site, in_metas, error) from error
            if out is None:
                zeros = [torch.zeros(m.shape, dtype=m.dtype, device=m.device) for m in in_metas]
                try:
                    with torch.no_grad():
                        out = (func.eager if isinstance(func, BatchedFunction) else func)(
                            *fill(targs, zeros), **fill(tkwargs, zeros)
                        )
                except Exception as error:
                    raise _shape_error(name, site, in_metas, error) from error
        ok = isinstance(out, Tensor) or (
            isinstance(out, (tuple, list)) and out and all(isinstance(o, Tensor) for o in out)
        )
        if not ok:
            raise UnsupportedOpError(
                f"{name} at {site} returns {type(out).__name__}, not a tensor or a tuple of "
                "tensors, so it cannot be recorded lazily."
            )
        return out

    def _to_meta(self, template: Any) -> Any:
        kind = type(template)
        if kind is tuple or kind is list:
            return kind(self._to_meta(item) for item in template)
        if kind is dict:
            return {name: self._to_meta(item) for name, item in template.items()}
        if isinstance(template, Tensor) and template.device.type != "meta":
            cached = self._meta_tensors.get(id(template))
            if cached is None:
                cached = (template, template.to("meta"))
                self._meta_tensors[id(template)] = cached
            return cached[1]
        return template

    # -- running -------------------------------------------------------------------------------

    def flush(self) -> None:
        """Schedule and run every pending node (at the end, or when a value is read)."""
        if not self.graph.pending:
            return
        with torch._C.DisableTorchFunction():
            start = time.perf_counter()
            plan = schedule(
                self.graph, self.scheduler, len(self.store.outputs), self.store.locations
            )
            middle = time.perf_counter()
            self.store.run(plan)
            end = time.perf_counter()
        self.stats.schedule_s += middle - start
        self.stats.execute_s += end - middle
        self.stats.nodes += plan.num_nodes
        self.stats.steps += len(plan.steps)
        self.stats.segments += 1
        self.stats.plan = plan
        self.graph.clear_pending()

    def read(self, lazy: Lazy, what: str) -> Tensor:
        """``lazy``'s value: a sync point, where the instance waits for a batched run."""
        if self.closed:
            raise LazyValueError(LAZY_AFTER_RUN.format(what=what))
        if lazy._vid >> OUT_BITS >= self.graph.node_base:
            if self.driver.in_instance:
                self.driver.pause()  # resumes once every instance waits or is done
            else:
                self.flush()
        return self.store.value(lazy._vid)

    def materialize(self, result: Any) -> Any:
        """Replace every lazy value in a (nested) result by its tensor.

        Values are gathered with one ``index_select`` per step output and then unbound, so
        returning many values stays cheap in the backward pass too.
        """
        lazies: list[Lazy] = []
        tree_map(lambda x: lazies.append(x) if type(x) is Lazy else None, result)
        if not lazies:
            return result
        tensors = dict(
            zip(map(id, lazies), self.store.values([x._vid for x in lazies]), strict=True)
        )
        return tree_map(lambda x: tensors[id(x)] if type(x) is Lazy else x, result)


def _template(obj: Any, lazies: list[Lazy]) -> Any:
    """The argument structure with each lazy value replaced by a :class:`Slot`, in order."""
    kind = type(obj)
    if kind is Lazy:
        lazies.append(obj)
        return Slot(len(lazies) - 1)
    if kind is tuple or kind is list:
        return kind(_template(item, lazies) for item in obj)
    if kind is dict:
        return {name: _template(item, lazies) for name, item in obj.items()}
    return obj


def _shared_tensors(template: Any) -> list[Tensor]:
    kind = type(template)
    if kind is tuple or kind is list:
        return [t for item in template for t in _shared_tensors(item)]
    if kind is dict:
        return [t for item in template.values() for t in _shared_tensors(item)]
    return [template] if isinstance(template, Tensor) else []


def _check_inputs(
    name: str, site: str, in_metas: tuple[TensorMeta, ...], template: Any
) -> torch.device:
    """One op's tensors must share a device and a floating dtype; returns the device."""
    shared = [t for t in _shared_tensors(template) if t.dim() > 0]
    devices = {m.device for m in in_metas} | {t.device for t in shared}
    if len(devices) > 1:
        raise DeviceError(
            f"{name} at {site} mixes devices {sorted(map(str, devices))}. Move the model and "
            "the tensors an instance creates to one device, e.g. torch.tensor(x, device=dev)."
        )
    floats = {m.dtype for m in in_metas if m.dtype.is_floating_point and m.shape}
    floats |= {t.dtype for t in shared if t.dtype.is_floating_point}
    if len(floats) > 1:
        raise DtypeError(
            f"{name} at {site} mixes dtypes {sorted(map(str, floats))}; batchfold does not cast "
            "silently. Cast explicitly, e.g. x.to(torch.float32), or use one default dtype."
        )
    return devices.pop() if devices else torch.device("cpu")


def _shape_error(
    name: str, site: str, in_metas: tuple[TensorMeta, ...], error: Exception
) -> ShapeError:
    ins = ", ".join(map(str, in_metas)) or "no per-instance inputs"
    return ShapeError(
        f"{name} at {site} cannot take per-instance inputs ({ins}): {type(error).__name__}: {error}"
    )


def _batched_source(sig: Signature, inputs: list[Tensor], n: int) -> Tensor:
    raise AssertionError("source steps are built by the executor from their payloads")


_SOURCE = OpRule("source", _batched_source, cheap=True)


class BatchedFunction:
    """A function recorded as one node per call inside ``batch_map`` (see :func:`function`)."""

    def __init__(self, fn: Callable[..., Any], batched: bool) -> None:
        self.fn = fn
        self.batched = batched
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)
        self.rule = OpRule(self.__name__, self._batched_call if batched else self._vmapped_call)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _ACTIVE and _has_lazy(args, kwargs):
            return _ACTIVE[-1].call(self, args, kwargs)
        return self.eager(*args, **kwargs)

    def eager(self, *args: Any, **kwargs: Any) -> Any:
        """Call the function on one instance's real tensors."""
        if not self.batched:
            return self.fn(*args, **kwargs)
        out = self.fn(*tree_map(_unsqueeze, args), **tree_map(_unsqueeze, kwargs))
        return tree_map(lambda t: t.squeeze(0) if isinstance(t, Tensor) else t, out)

    def _batched_call(self, sig: Signature, inputs: list[Tensor], n: int) -> Any:
        from .ops import fill

        args, kwargs = sig.template
        return self.fn(*fill(args, inputs), **fill(kwargs, inputs))

    def _vmapped_call(self, sig: Signature, inputs: list[Tensor], n: int) -> Any:
        from .ops import fill

        args, kwargs = sig.template
        return torch.func.vmap(
            lambda *xs: self.fn(*fill(args, xs), **fill(kwargs, xs)), randomness="different"
        )(*inputs)

    def __repr__(self) -> str:
        return f"function({self.__name__}, batched={self.batched})"


def _unsqueeze(x: Any) -> Any:
    return x.unsqueeze(0) if isinstance(x, Tensor) else x


def function(fn: Callable[..., Any] | None = None, *, batched: bool = False) -> Any:
    """Record each call of ``fn`` inside ``batch_map`` as one node instead of one per op.

    Use it on a cell or layer that is a pure function of its tensor arguments: recording gets
    cheaper and the batched step runs ``fn`` once. With ``batched=False``, ``fn`` is written
    for one instance and is batched with ``torch.func.vmap``; with ``batched=True``, ``fn``
    already takes a leading batch dimension (like an ``nn.Linear``) and is called on the batch.
    Outside ``batch_map`` the wrapper calls ``fn`` as usual.

    Arguments:
        fn: the function or ``nn.Module`` to wrap (or leave out to use as a decorator).
        batched: whether ``fn`` accepts a leading batch dimension.

    Returns:
        The wrapped callable.

    Example:
        >>> import torch, batchfold as bf
        >>> cell = bf.function(torch.nn.Linear(3, 2), batched=True)
        >>> out = bf.batch_map(lambda v: cell(torch.tensor(v)), [[1.0, 2.0, 3.0]] * 4)
        >>> len(out), tuple(out[0].shape)
        (4, (2,))
    """
    if fn is None:
        return lambda f: BatchedFunction(f, batched)
    return BatchedFunction(fn, batched)


@overload
def batch_map(
    fn: Callable[[Any], Any],
    instances: Iterable[Any],
    *,
    scheduler: Scheduler = ...,
    return_stats: Literal[False] = ...,
) -> list[Any]: ...


@overload
def batch_map(
    fn: Callable[[Any], Any],
    instances: Iterable[Any],
    *,
    scheduler: Scheduler = ...,
    return_stats: Literal[True],
) -> tuple[list[Any], Stats]: ...


def batch_map(
    fn: Callable[[Any], Any],
    instances: Iterable[Any],
    *,
    scheduler: Scheduler = "agenda",
    return_stats: bool = False,
) -> list[Any] | tuple[list[Any], Stats]:
    """Run single-instance PyTorch code on many instances as a few batched operations.

    ``fn`` is ordinary code written for one instance. Inside it, tensors the instance makes
    (``torch.tensor(...)``) and everything computed from them are recorded rather than run;
    parameters and other tensors from outside are shared. The recorded graph of all instances
    is then scheduled (``"agenda"``: DyNet's heuristic; ``"depth"``: TensorFlow Fold's) and run
    with one batched call per step.

    Arguments:
        fn: the per-instance function; it may return tensors or nested lists, tuples and dicts
            of them.
        instances: the inputs, one per call of ``fn``.
        scheduler: ``"agenda"`` or ``"depth"``; both give the same values.
        return_stats: also return the run's :class:`~batchfold.stats.Stats`.

    Returns:
        ``[fn(x) for x in instances]`` with real tensors (and the stats, when asked for).

    Raises:
        ShapeError: an op in ``fn`` got per-instance inputs of shapes it cannot take; the
            message names the file and line.
        DeviceError, DtypeError: one op mixed devices or floating dtypes.

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
    rec = Recorder(scheduler)
    start = time.perf_counter()
    _ACTIVE.append(rec)
    collecting = gc.isenabled()
    gc.disable()  # recording makes many small acyclic objects; collections only cost time
    try:
        with rec:
            results = rec.driver.run(fn, instances)
            rec.stats.instances = len(results)
            rec.flush()
            outputs = rec.materialize(results)
    finally:
        if collecting:
            gc.enable()
        _ACTIVE.remove(rec)
        rec.closed = True
    stats = rec.stats
    stats.fallbacks = dict(rec.store.fallbacks)
    stats.syncs = rec.driver.syncs
    stats.record_s = time.perf_counter() - start - stats.schedule_s - stats.execute_s
    _LAST_STATS[:] = [stats]
    return (outputs, stats) if return_stats else outputs


def last_stats() -> Stats | None:
    """The statistics of the most recent ``batch_map`` call in this process."""
    return _LAST_STATS[0] if _LAST_STATS else None
