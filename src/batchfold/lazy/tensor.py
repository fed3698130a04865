"""The :class:`Lazy` tensor: one instance's value inside ``batch_map``, recorded, not computed.

Every ``torch.Tensor`` method and operator on a ``Lazy`` goes to its recorder, which adds a
graph node and returns a new ``Lazy``. In-place forms (``x.add_(y)``, ``x += y``,
``x[i] = v``) record the out-of-place op and rebind the same Python object to the result, so
every name bound to ``x`` sees the write, as in eager PyTorch. Writes that eager PyTorch
would make visible through a view are refused (see ``Recorder.write``).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch
from torch.utils._pytree import tree_leaves

from ..errors import UnsupportedOpError
from ..graph import TensorMeta
from .lengths import TracedShape, traced_size
from .sites import user_site

if TYPE_CHECKING:
    from .recorder import Recorder

Tensor = torch.Tensor


def _item(value: Any) -> Any:
    """``.item()`` of a tensor; a number read as one already is its item."""
    return value.item() if isinstance(value, Tensor) else value


class Lazy:
    """A per-instance tensor inside ``batch_map``: known shape and dtype, value not yet computed.

    It supports the ``torch.Tensor`` API: functions, methods and operators are recorded,
    and ``shape``, ``dtype``, ``device``, ``dim()`` and ``size()`` answer at once.
    ``_view`` is ``None``, or weak references to the lazy values this one may view.
    """

    __slots__ = ("_rec", "_vid", "_meta", "_view", "__weakref__")
    is_nested = False  # never a nested tensor (nn.MultiheadAttention asks)
    # nor any other layout than a dense one: what library code checks before it computes
    is_sparse = is_sparse_csr = is_quantized = is_meta = is_mkldnn = False
    layout = torch.strided

    @property
    def is_cpu(self) -> bool:
        """Whether the value will live on the CPU."""
        return self._meta.device.type == "cpu"

    @property
    def itemsize(self) -> int:
        """Bytes of one element."""
        return self._meta.dtype.itemsize

    @property
    def nbytes(self) -> int:
        """Bytes of the value's elements."""
        return self._meta.dtype.itemsize * math.prod(self.shape)

    def __init__(self, rec: Recorder, vid: int, meta: TensorMeta) -> None:
        self._rec, self._vid, self._meta = rec, vid, meta
        self._view: tuple[weakref.ref[Lazy], ...] | None = None

    @property
    def shape(self) -> torch.Size:
        """The shape of one instance's value (see :mod:`.lengths` while a call is traced)."""
        trace = self._rec.trace
        if trace is not None and self._vid in trace.ragged:  # traced, its length left out
            size = traced_size(
                self._meta.size, trace.lengths or (0,), trace, trace.ragged[self._vid]
            )
            return cast(torch.Size, size)  # a tuple: torch.Size holds ints only
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
        lazy = first_lazy((args, kwargs))
        return lazy._rec.call(func, args, kwargs or {})

    def __copy__(self) -> Lazy:
        """``copy.copy``: eagerly another tensor object on the same memory, so a write through
        either shows in both; here the value itself (the one thing that differs: ``is``).
        Refused for a value that requires grad: eagerly its copy is a new leaf, cut from the
        history (no gradient reaches what made it), which a value inside cannot be."""
        if self.requires_grad:
            raise UnsupportedOpError(
                f"copy.copy at {user_site()} of a lazy value that requires grad: eagerly the copy "
                "is a new leaf, "
                "cut from the value's history, which a value inside batch_map cannot be. Use "
                "x.detach() for a value without the history, or x itself."
            )
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Lazy:
        """A copy, as eager PyTorch's ``copy.deepcopy`` of a tensor: refused, as eagerly, for a
        value that requires grad (no leaf)."""
        if self.requires_grad:
            raise RuntimeError(
                "Only Tensors created explicitly by the user (graph leaves) support the "
                "deepcopy protocol at the moment. If you were attempting to deepcopy a module, "
                "this may be because of a torch.nn.utils.weight_norm usage, see "
                "https://github.com/pytorch/pytorch/pull/103001"
            )
        return self._rec.call(torch.Tensor.clone, (self,), {})

    def __repr__(self) -> str:
        return f"Lazy({self._meta}, value {self._vid})"

    __hash__ = object.__hash__

    @property
    def ndim(self) -> int:
        """Number of dimensions of one instance's value."""
        return len(self._meta.size)

    def dim(self) -> int:
        """Number of dimensions of one instance's value."""
        return len(self._meta.size)

    def size(self, dim: int | None = None) -> Any:
        """The shape, or the length of dimension ``dim``."""
        return self.shape if dim is None else self.shape[dim]

    def numel(self) -> int:
        """Number of elements of one instance's value."""
        shape = self.shape
        return shape.numel() if type(shape) is TracedShape else self._meta.size.numel()

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d lazy tensor")
        return int(self.shape[0])  # a traced call's length notes the use

    def is_floating_point(self) -> bool:
        """Whether the dtype is a floating-point type."""
        return self.dtype.is_floating_point

    @property
    def is_cuda(self) -> bool:
        """Whether the value will live on a CUDA device."""
        return self.device.type == "cuda"

    @property
    def requires_grad(self) -> bool:
        """Whether the value will require grad: as eager PyTorch's would (see
        ``Signature.grad_rule``)."""
        trace = self._rec.trace
        if trace is not None:  # a traced call that branches on it must not be cached
            trace.refuse("reads requires_grad of a lazy value, which its cache key leaves out")
        dtype = self._meta.dtype
        differentiable = dtype.is_floating_point or dtype.is_complex
        return differentiable and self._vid not in self._rec.graph.grad_free

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        if bool(value) != self.requires_grad:  # to what it is: nothing, as eagerly
            cast(Any, self).requires_grad_(value)  # refused, as the method is

    @property
    def T(self) -> Lazy:  # noqa: N802
        """The transpose (all dims reversed)."""
        return self._rec.call(torch.Tensor.permute, (self, *reversed(range(self.ndim))), {})

    @property
    def mT(self) -> Lazy:  # noqa: N802
        """The transpose of the last two dims."""
        return self._rec.call(torch.Tensor.transpose, (self, -2, -1), {})

    @property
    def mH(self) -> Lazy:  # noqa: N802
        """The conjugate transpose of the last two dims."""
        return self._rec.call(torch.Tensor.adjoint, (self,), {})

    @property
    def H(self) -> Lazy:  # noqa: N802
        """The conjugate transpose of a matrix, as eager's (a vector's: its conjugate)."""
        if self.ndim > 2:
            raise RuntimeError("tensor.H is only supported on matrices (2-D tensors); use .mH")
        return self.mH if self.ndim == 2 else self._rec.call(torch.Tensor.conj, (self,), {})

    @property
    def real(self) -> Lazy:
        """The real part (the value itself, for real dtypes)."""
        return self._rec.call(torch.real, (self,), {})

    @property
    def imag(self) -> Lazy:
        """The imaginary part (complex dtypes; eager raises for real ones)."""
        return self._rec.call(torch.imag, (self,), {})

    def __iter__(self):  # noqa: ANN204
        shape = self._meta.shape
        if shape and shape[0] == 0:  # no rows: nothing, as eagerly (unbind would give no tensor)
            return iter(())
        return iter(self._rec.call(torch.Tensor.unbind, (self, 0), {}))

    def __setitem__(self, index: Any, value: Any) -> None:
        self._rec.write(self, set_item, (self, index, value), {}, "item assignment")

    def _read(self, what: str) -> Tensor:
        return self._rec.read(self, what)

    def _number(self, what: str, convert: Callable[[Any], Any]) -> Any:
        """``convert`` of the value (a sync point). One 0-d real value is read as a number
        without its tensor (:meth:`Recorder.read_number`); others go through the tensor, as
        eager's do (one element, or the error eager raises)."""
        if self._meta.shape or self._meta.dtype.is_complex:
            return convert(self._read(what))
        return convert(self._rec.read_number(self, what))

    def item(self) -> Any:
        """Compute the value (a sync point) and return it as a Python number."""
        return self._number("item()", _item)

    def tolist(self) -> Any:
        """Compute the value (a sync point) and return it as (nested) Python lists."""
        return self._read("tolist()").tolist()

    def __bool__(self) -> bool:
        return self._number("bool()", bool)

    def __int__(self) -> int:
        return self._number("int()", int)

    def __float__(self) -> float:
        return self._number("float()", float)

    def __index__(self) -> int:
        # PyTorch's argument parser calls this for a size (torch.ones(n, 2)): read at once,
        # without pausing inside that call (see Recorder.wait)
        return self._rec.read(self, "an index", pause=False).__index__()

    def new_zeros(self, *size: Any, **kwargs: Any) -> Any:
        """``torch.zeros(size)`` with this tensor's dtype and device (a per-instance constant)."""
        return self._new(torch.zeros, size, kwargs)

    def new_ones(self, *size: Any, **kwargs: Any) -> Any:
        """``torch.ones(size)`` with this tensor's dtype and device (a per-instance constant)."""
        return self._new(torch.ones, size, kwargs)

    def new_empty(self, *size: Any, **kwargs: Any) -> Any:
        """``torch.zeros(size)`` (values of a new empty tensor are never read eagerly either)."""
        return self._new(torch.zeros, size, kwargs)

    def new_full(self, size: Any, fill_value: Any, **kwargs: Any) -> Any:
        """``torch.full(size, fill_value)`` with this tensor's dtype and device."""
        kwargs = {"dtype": self.dtype, "device": self.device, **kwargs}
        return torch.full(size, fill_value, **kwargs)

    def new_tensor(self, data: Any, **kwargs: Any) -> Any:
        """``torch.tensor(data)`` with this tensor's dtype and device."""
        kwargs = {"dtype": self.dtype, "device": self.device, **kwargs}
        return torch._C._VariableFunctions.tensor(data, **kwargs)  # pyright: ignore  # as eager

    def _new(self, factory: Any, size: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
            size = tuple(size[0])
        return factory(size, **{"dtype": self.dtype, "device": self.device, **kwargs})

    def numpy(self) -> Any:
        """The value (a sync point) as a read-only NumPy array (see ``__array__``)."""
        return self.__array__()

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        """``np.asarray(x)``: the value as a NumPy array (a sync point), as eagerly; without
        it NumPy would wrap the lazy object in an array of objects."""
        if copy is False:  # as NumPy answers a tensor, whose __array__ cannot promise it
            raise ValueError("Unable to avoid copy while creating an array as requested.")
        array = self._read("np.asarray()").__array__(dtype)
        if dtype is None:  # eager's shares the tensor's memory: a write would change it unseen
            array.flags.writeable = False
        return array

    def __format__(self, spec: str) -> str:
        """``f"{loss:.3f}"``: a 0-d value's number (a sync point), as eager PyTorch formats it."""
        if not self._meta.shape:
            return format(self.item(), spec)
        return object.__format__(self, spec)


def set_item(x: Tensor, index: Any, value: Any) -> Tensor:
    """``x[index] = value`` without changing ``x``: the functional form of item assignment."""
    x = x.clone()
    x[index] = value
    return x


def first_lazy(tree: tuple[Any, Any]) -> Lazy:
    """The first :class:`Lazy` in a call's ``(args, kwargs)``, nested tuples, lists and dicts too."""
    args, kwargs = tree
    for item in args:  # the common case, without tree_leaves's garbage (see map_lazies)
        if type(item) is Lazy:
            return item
    for item in tree_leaves(tree):
        if type(item) is Lazy:
            return item
    raise AssertionError("no lazy value among the arguments")
