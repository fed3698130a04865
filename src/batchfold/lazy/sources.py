"""Per-instance constants: what a factory (``torch.tensor``, ``torch.zeros``...) makes inside ``batch_map``.

A factory call with no lazy argument runs at once and its result becomes a *source* node:
a node with no inputs whose per-instance value is its payload. ``torch.tensor(x)`` of a
Python number keeps only the number, and the batched step builds one tensor from all of
them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..errors import UnsupportedOpError
from ..graph import Signature, TensorMeta
from ..opbase import named
from ..ops import OpRule
from ..ragged import join_family, ragged_meta
from ..signature import NO_GRAD
from .context import dry, stop_dry
from .dispatch import ORIGINAL_TENSOR
from .semantics import is_random
from .sites import func_name, user_site, version
from .tensor import Lazy

if TYPE_CHECKING:
    from .recorder import Recorder

Tensor = torch.Tensor

FACTORIES = frozenset(
    getattr(torch, name)
    for name in (
        "tensor",
        "as_tensor",
        "asarray",
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
# arithmetic whose Python number operand may differ per instance (``prediction - target``)
_NUMBER_OPS = frozenset(
    [
        *named("add", "sub", "mul", "div", "true_divide", "subtract", "multiply", "divide"),
        *(
            getattr(Tensor, f"__{n}__")
            for n in (["add", "radd", "sub", "rsub", "mul", "rmul", "truediv", "rtruediv"])
        ),
    ]
)
_GETITEM = Tensor.__getitem__
_grad_enabled = torch.is_grad_enabled
_OPERAND_DTYPES = frozenset([torch.float32, torch.float64])
_SWITCHED = object()
_SCALAR_DTYPES: dict[type, torch.dtype | None] = {int: torch.int64, bool: torch.bool, float: None}
_PYTHON_DTYPES: dict[Any, torch.dtype] = {  # dtype=float, as PyTorch reads a Python type
    float: torch.float64,
    int: torch.int64,
    bool: torch.bool,
    complex: torch.complex128,
}
_NUMBER_KEYWORDS = frozenset(("dtype", "device"))


_AS_TENSOR = torch.as_tensor
_SHARING = frozenset([torch.as_tensor, torch.asarray])  # a tensor argument: returned itself


def _same_memory(value: Tensor, data: Any) -> bool:
    """Whether ``torch.as_tensor(data)`` gave ``data``'s own memory (no copy)."""
    if isinstance(data, Tensor):
        return value is data
    return isinstance(data, np.ndarray) and data.size > 0 and value.data_ptr() == data.ctypes.data


def _batched_source(sig: Signature, inputs: list[Tensor], n: int) -> Tensor:
    raise AssertionError("source steps are built by the executor from their payloads")


SOURCE = OpRule("source", _batched_source, cheap=True)


class SourceMaker:
    """Makes the source nodes of one recorder, one signature per kind of constant."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self._scalars: dict[tuple[Any, ...], tuple[Signature, TensorMeta]] = {}
        # values that are the instance's own memory (torch.as_tensor(x) made no copy): eager
        # PyTorch writes into them change x, which a recorded write does not (writes.py)
        self.instance_memory: set[int] = set()
        self.watched: list[tuple[Tensor, int]] = []  # such tensors, with their versions
        self.arrays: list[tuple[np.ndarray, Tensor]] = []  # such NumPy arrays, with copies
        self.eager: dict[int, Tensor] = {}  # such values' eager tensors: results give them back

    def operand(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """``x - c`` whose number ``c`` has differed between calls: ``c`` as a source node.

        Called when a call has no signature yet. Numbers are part of a signature, so a number
        that differs per instance (a regression target) would make every instance's op a
        signature of its own, batched with nothing. Once a second number is seen for the
        same op and tensor, the number becomes a 0-d tensor of the tensor's dtype, read per
        instance: the arguments to record instead, or ``None``. Only for float32 and float64
        tensors, where eager PyTorch computes with the number cast to the tensor's dtype (as
        a 0-d tensor of that dtype is), so values and dtypes stay eager's.
        """
        if kwargs or len(args) != 2:
            return None
        if func is _GETITEM:
            return self._index_operand(*args)
        if func not in _NUMBER_OPS:
            return None
        a, b = args
        if type(a) is Lazy and (type(b) is float or type(b) is int):
            lazy, number, at = a, b, 1
        elif type(b) is Lazy and (type(a) is float or type(a) is int):
            lazy, number, at = b, a, 0
        else:
            return None
        if type(number) is int and not -(2**63) <= number < 2**63:
            return None  # eager refuses it (too big for a scalar): so does its signature
        meta = lazy._meta
        if meta.dtype not in _OPERAND_DTYPES:
            return None
        value = self._once_switched((func, meta, at), number, meta.dtype, meta.device)
        if value is None:
            return None
        return (lazy, value) if at == 1 else (value, lazy)

    def _once_switched(self, pattern: Any, number: Any, dtype: Any, device: Any) -> Lazy | None:
        """``number`` as a per-instance 0-d source once ``pattern`` has seen another number,
        else ``None`` (the number stays a constant of its op's signature)."""
        operands = self.rec.graph.operands  # kept with the graph, as its signatures are
        seen = operands.get(pattern, number)
        if seen is not _SWITCHED and seen == number:
            operands[pattern] = number
            return None
        operands[pattern] = _SWITCHED
        kwargs = {"device": device} if dtype is None else {"dtype": dtype, "device": device}
        with torch._C.DisableTorchFunction():  # from a Lazy method the mode is still on
            return self.number((number,), kwargs)

    def _index_operand(self, x: Any, index: Any) -> tuple[Lazy, Lazy] | None:
        """``x[i]`` whose Python ``int`` ``i`` has differed between calls: ``i`` as a source.

        ``log_probs[gold]`` or ``states[head]`` with a different position per instance would
        otherwise make a signature per position, each batched only with the instances that
        pick the same one (a decoder's per-step loss ran as 35 steps of 2 or 3 rows). Once a
        second position is seen for the same ``x`` meta, ``i`` becomes a 0-d int64 tensor read
        per instance, and ``x[i]`` one batched pick. Outside grad mode only where ``x`` was made
        outside it too: eager's ``x[i]`` is a view and keeps ``x``'s ``requires_grad``, which
        a pick (a copy) would not. Positions out of ``x``'s range stay Python ints, so that
        the call fails as eager indexing does. With ragged batching the positions are counted
        over ``x`` of every length.
        """
        if type(x) is not Lazy or type(index) is not int or self.rec.trace is not None:
            return None  # in a traced module call, x[-1] stays one op of its template
        if not _grad_enabled() and x._vid not in self.rec.graph.grad_free:
            return None  # x may require grad: eager's x[i] is a view that does too, a pick not
        shape = x._meta.shape
        if not shape or not -shape[0] <= index < shape[0]:
            return None
        meta = x._meta
        # with ragged batching, positions in x of any length count together (x[-1] of any
        # length is one ragged step already; x[i] with i differing is one pick)
        pattern = (_GETITEM, ragged_meta(meta) if self.rec.ragged else meta)
        value = self._once_switched(pattern, index, None, meta.device)
        return None if value is None else (x, value)

    def number(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Lazy | None:
        """``torch.tensor(value, dtype=..., device=...)`` of a Python number: a source node.

        The common case (a word id, a label), on its own fast path: one signature per kind of
        number, dtype and device. ``None`` for any other call of ``torch.tensor``.
        """
        if len(args) != 1 or type(args[0]) not in _SCALAR_DTYPES:
            return None
        if kwargs.get("device") is None and torch._C._len_torch_function_stack():
            # a mode under the recorder may be a default device (torch.set_default_device,
            # `with torch.device(...)`); dispatch.tensor's path sees the recorder alone
            kwargs = {**kwargs, "device": torch.get_default_device()}
        return self.scalar(args[0], kwargs)

    def scalar(self, value: Any, kwargs: dict[str, Any]) -> Lazy | None:
        """:meth:`number` of a Python ``int``, ``float`` or ``bool`` ``value``."""
        rec = self.rec
        dtype = device = None
        if kwargs:
            if not _NUMBER_KEYWORDS.issuperset(kwargs):
                return None
            dtype, device = (
                _PYTHON_DTYPES.get(kwargs.get("dtype"), kwargs.get("dtype")),
                kwargs.get("device"),
            )
        kind = type(value)  # a float's dtype is the default one where none is given
        default = torch.get_default_dtype() if kind is float and dtype is None else None
        cache_key = (kind, default, dtype, device)
        cached = self._scalars.get(cache_key)
        if cached is None:
            cached = self._scalars[cache_key] = self._number_signature(value, dtype, device)
        sig, meta = cached
        vid = rec.graph.add_source(sig, rec.instance, value)
        if rec.trace is not None:
            rec.trace.ops.append((sig, (), vid, value))
        return Lazy(rec, vid, meta)

    def _number_signature(
        self, value: Any, dtype: torch.dtype | None, device: Any
    ) -> tuple[Signature, TensorMeta]:
        dtype = dtype or _SCALAR_DTYPES[type(value)] or torch.get_default_dtype()
        # the device eager torch.tensor gives: the default one when none is named, with its
        # index ("cuda" is "cuda:0", as parameters report it)
        with torch._C.DisableTorchFunction():  # from dispatch.tensor the mode is still on
            meta = TensorMeta.of((), dtype, torch.empty(0, device=device).device)
        return self._signature(ORIGINAL_TENSOR, meta, "scalar"), meta

    def _signature(self, func: Any, meta: TensorMeta, kind: str) -> Signature:
        graph = self.rec.graph
        key = ("source", meta, kind)
        sig = graph.lookup(key)
        if sig is None:
            sig = graph.signature(
                key,
                func=func,
                rule=SOURCE,
                name=func_name(func),
                out_metas=(meta,),
                site=user_site(),
                source=kind,
            )
            if self.rec.ragged:
                join_family(graph.families, sig, key)
            sig.keep = True  # a constant's kind: nothing held by identity
            sig.set_grad_rule(NO_GRAD)  # but a factory's made with requires_grad (see make)
        return sig

    def make(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run a factory and make its result a lazy per-instance constant (numbers given to
        ``torch.tensor`` take :meth:`number` first)."""
        rec = self.rec
        if dry() and is_random(func):  # drawn, the numbers could not be given back
            stop_dry(f"{func_name(func)}()")
        value = func(*args, **kwargs)
        if not isinstance(value, Tensor):
            return value
        if value.layout != torch.strided:
            raise UnsupportedOpError(
                f"{func_name(func)} at {user_site()} makes a {value.layout} tensor: batch_map "
                "batches dense (strided) tensors only; convert it first, x.to_dense()."
            )
        data = args[0] if args else None
        own = _same_memory(value, data) if func in _SHARING else False
        eager = value
        if own and isinstance(data, np.ndarray):  # eager shares the array's memory, which has
            value = value.clone()  # no version: a copy now, compared at every run (recorder.py)
            self.arrays.append((data, value))
        meta = TensorMeta.of(tuple(value.shape), value.dtype, value.device)
        sig = self._signature(func, meta, "tensor")
        vid = rec.graph.add(sig, (), rec.instance, value)
        if own:
            self.instance_memory.add(vid)
            self.eager[vid] = eager
            if value is data:  # read when the batch runs: watched till batch_map ends
                self.watched.append((value, version(value)))
        if value.requires_grad:  # torch.zeros(3, requires_grad=True): stacked, it keeps its grad
            rec.graph.grad_free.discard(vid)
            self.eager[vid] = value  # returned, it is that leaf, whose .grad backward fills
        if rec.trace is not None:
            if value.requires_grad:
                rec.trace.refuse("makes a tensor that requires grad")
            if is_random(func):
                rec.trace.refuse("draws random numbers in a factory")
            rec.trace.ops.append((sig, (), vid, value))
        return Lazy(rec, vid, meta)

    def check_memory(self) -> None:
        """Refuse a run after an instance's own memory that ``torch.as_tensor`` read without a
        copy changed: eagerly the tensor is that memory, so what eager code computes after the
        change sees the new values, where the value batch_map read once does not. Checked at
        every run and before results go back, for the whole ``batch_map`` (a change after a
        sync point would reach values the first run computed)."""
        for tensor, seen in self.watched:
            if version(tensor) != seen:
                raise UnsupportedOpError(
                    f"an instance's tensor ({tuple(tensor.shape)}) read with torch.as_tensor, "
                    "which made no copy, was changed in place inside the function: eager "
                    "PyTorch's tensor is that memory, so ops after the change see its new "
                    "values, where batch_map read it once. Copy it first: "
                    "torch.as_tensor(x).clone()."
                )
        for array, copy in self.arrays:
            if array.tobytes() != copy.numpy().tobytes():
                raise UnsupportedOpError(
                    f"an instance's NumPy array ({array.shape}) read with torch.as_tensor or "
                    "torch.asarray, whose memory eager PyTorch shares, was changed inside the "
                    "function: eagerly, ops after the change see the new values and ops "
                    "before it the old ones, which batch_map cannot tell apart. Copy it when "
                    "reading it (torch.tensor(x)), or change it before."
                )


_AS_TENSOR_KEYWORDS = frozenset(["dtype", "device", "copy", "requires_grad"])


def as_itself(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Lazy | None:
    """``torch.as_tensor(x)`` or ``torch.asarray(x)`` of a lazy ``x`` that needs no conversion:
    ``x`` itself, as eager PyTorch returns it (a write through the result changes ``x``), or
    its detached view for ``requires_grad=False``; ``None`` for a call that converts or
    copies, which records as an op. ``requires_grad=True`` of a value that does not require
    grad is refused, as ``requires_grad_()`` is: a value inside is no leaf of its own."""
    x: Lazy = args[0]
    if len(args) > 1 or not _AS_TENSOR_KEYWORDS.issuperset(kwargs) or kwargs.get("copy"):
        return None
    dtype, device = kwargs.get("dtype"), kwargs.get("device")
    if dtype is not None and dtype != x.dtype:
        return None
    if device is not None:  # "cuda" names the current one, as eager compares
        with torch._C.DisableTorchFunction():
            if torch.empty(0, device=device).device != x.device:
                return None
    grad = kwargs.get("requires_grad")
    if grad is None or (grad and x.requires_grad):
        return x  # requires_grad=True of a value that requires grad: eager returns it too
    if not grad:
        return x._rec.call(torch.Tensor.detach, (x,), {})
    raise UnsupportedOpError(
        f"torch.asarray(..., requires_grad=True) at {user_site()}: a tensor made inside the "
        "function is not a leaf of its own; pass a tensor that requires grad in the instance"
    )
