"""Shape inference for a new kind of node: its argument template, checks, and output metas.

Output shapes and dtypes come from running the op once on meta tensors (or on zeros where
the op has no meta kernel), so they are eager PyTorch's own, promotion rules included.
Errors from the op become a :class:`~batchfold.errors.ShapeError` naming the user's line;
errors that are not about the inputs (a ``RecursionError``, ``MemoryError``) pass through.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import (
    ArgumentShapeError,
    BatchfoldError,
    DeviceError,
    DtypeError,
    IndexShapeError,
    ShapeError,
    UnsupportedOpError,
    add_note,
)
from ..graph import Slot, TensorMeta
from ..ops import fill
from .known_shapes import known_shape
from .semantics import is_random
from .tensor import Lazy

Tensor = torch.Tensor
# what an op raises when its inputs do not fit; anything else is not a shape problem
_INPUT_ERRORS = (RuntimeError, ValueError, TypeError, IndexError)
_NOT_INPUT_ERRORS = (RecursionError, MemoryError, NotImplementedError)


def template(obj: Any, lazies: list[Any]) -> Any:
    """The argument structure with each lazy value replaced by a :class:`Slot`, in order."""
    kind = type(obj)
    if kind is Lazy:
        lazies.append(obj)
        return Slot(len(lazies) - 1)
    if kind is tuple or kind is list:
        return kind(template(item, lazies) for item in obj)
    if kind is dict:
        return {name: template(item, lazies) for name, item in obj.items()}
    return obj


def lazy_metas(obj: Any, metas: list[TensorMeta]) -> None:
    """Append the meta of every lazy value in ``obj`` (nested tuples, lists, dicts), in order."""
    kind = type(obj)
    if kind is Lazy:
        metas.append(obj._meta)
    elif kind is tuple or kind is list:
        for item in obj:
            lazy_metas(item, metas)
    elif kind is dict:
        for item in obj.values():
            lazy_metas(item, metas)


def shared_tensors(tree: Any) -> list[Tensor]:
    """The tensors (shared ones, in a template) in nested tuples, lists and dicts."""
    kind = type(tree)
    if kind is tuple or kind is list:
        return [t for item in tree for t in shared_tensors(item)]
    if kind is dict:
        return [t for item in tree.values() for t in shared_tensors(item)]
    return [tree] if isinstance(tree, Tensor) else []


def check_inputs(name: str, site: str, in_metas: tuple[TensorMeta, ...], tree: Any) -> torch.device:
    """One op's tensors must share a device and a floating dtype; returns the device."""
    shared = [t for t in shared_tensors(tree) if t.dim() > 0]
    devices = {m.device for m in in_metas} | {t.device for t in shared}
    if len(devices) > 1:
        raise DeviceError(
            f"{name} at {site} mixes devices {sorted(map(str, devices))}. Move the model and "
            "the tensors an instance creates to one device, e.g. torch.tensor(x, device=dev)."
        )
    floats = {m.dtype for m in in_metas if m.dtype.is_floating_point and m.shape}
    floats |= {t.dtype for t in shared if t.dtype.is_floating_point}
    autocast = torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda")
    if len(floats) > 1 and not autocast:  # under autocast its casts decide, as eagerly
        raise DtypeError(
            f"{name} at {site} mixes dtypes {sorted(map(str, floats))}; batchfold does not cast "
            "silently. Cast explicitly, e.g. x.to(torch.float32), or use one default dtype."
        )
    return devices.pop() if devices else torch.device("cpu")


def shape_error(
    name: str, site: str, in_metas: tuple[TensorMeta, ...], error: Exception
) -> ShapeError:
    """The error for an op that cannot take these per-instance inputs."""
    ins = ", ".join(map(str, in_metas)) or "no per-instance inputs"
    kind = (
        IndexShapeError
        if isinstance(error, IndexError)
        else ArgumentShapeError
        if isinstance(error, TypeError)
        else ShapeError
    )
    return kind(
        f"{name} at {site} cannot take per-instance inputs ({ins}): {type(error).__name__}: {error}"
    )


def _to_meta(tree: Any, cache: dict[int, tuple[Tensor, Tensor]]) -> Any:
    kind = type(tree)
    if kind is tuple or kind is list:
        return kind(_to_meta(item, cache) for item in tree)
    if kind is dict:
        return {name: _to_meta(item, cache) for name, item in tree.items()}
    if isinstance(tree, Tensor) and tree.device.type != "meta":
        cached = cache.get(id(tree))
        if cached is None:
            cached = cache[id(tree)] = (tree, tree.to("meta"))  # keeps the tensor (and id)
        return cached[1]
    return tree


def _copies(tree: Any) -> Any:
    """The template with copies of its shared tensors: a run for shapes must not write into
    the user's tensors (``batch_norm`` updates its running statistics in place)."""
    kind = type(tree)
    if kind is tuple or kind is list:
        return kind(_copies(item) for item in tree)
    if kind is dict:
        return {name: _copies(item) for name, item in tree.items()}
    return tree.detach().clone() if isinstance(tree, Tensor) else tree


_SMALL = 1 << 16  # elements: running an op on zeros of this size costs microseconds


def _small(targs: Any, tkwargs: Any, in_metas: tuple[TensorMeta, ...]) -> bool:
    sizes = [m.size.numel() for m in in_metas]
    sizes += [t.numel() for t in shared_tensors((targs, tkwargs))]
    return sum(sizes) <= _SMALL and all(m.device.type == "cpu" for m in in_metas)


def _try_zeros(func: Any, targs: Any, tkwargs: Any, in_metas: tuple[TensorMeta, ...]) -> Any:
    """The op's output on zeros, or ``None`` where zeros are not valid input or it draws."""
    if is_random(func):
        return None  # it would draw from the user's generator
    zeros = [torch.zeros(m.shape, dtype=m.dtype) for m in in_metas]
    try:
        with torch.no_grad():
            return func(*fill(_copies(targs), zeros), **fill(_copies(tkwargs), zeros))
    except (RecursionError, MemoryError):
        raise
    except Exception:  # the meta run below decides, and names the error
        return None


Outputs = tuple[Any, tuple[tuple[tuple[int, ...], torch.dtype], ...]]
_OUTPUTS: dict[Any, Outputs] = {}  # for the life of the process, see inference_key
_MAX_OUTPUTS = 1 << 14
_PLAIN = (type(None), int, float, bool, str, torch.dtype, torch.device, torch.layout)
_PLAIN_TENSORS = (Tensor, torch.nn.Parameter)


def inference_key(
    func: Any, targs: Any, tkwargs: Any, in_metas: tuple[TensorMeta, ...]
) -> tuple[Any, ...] | None:
    """What an op's output shapes depend on, or ``None`` where that cannot be said safely.

    The op, its input metas, and its other arguments: plain values as they are, tensors
    from outside by meta. A floating-point tensor's values never set an output's shape;
    an integer or boolean one's may (a mask, an index), so such a call, or one with a
    tensor subclass, a sparse tensor or an argument of another kind, is not keyed and its shapes are inferred each time. The
    default dtype is part of the key (``int + 0.5`` takes it); under autocast nothing is.
    """
    if torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda"):
        return None  # autocast picks output dtypes by its own state
    parts: list[Any] = []
    if not _key_parts((targs, tkwargs), parts):
        return None
    return (func, in_metas, torch.get_default_dtype(), tuple(parts))


def _key_parts(tree: Any, parts: list[Any]) -> bool:
    kind = type(tree)
    if kind is Slot:
        parts.append((Slot, tree.index))
    elif kind is tuple or kind is list or kind is torch.Size:
        parts.append((kind, len(tree)))
        return all(_key_parts(item, parts) for item in tree)
    elif kind is dict:
        parts.append((dict, tuple(tree)))
        return all(_key_parts(item, parts) for item in tree.values())
    elif isinstance(tree, Tensor):
        if type(tree) not in _PLAIN_TENSORS or tree.layout != torch.strided:
            return False  # a subclass or a sparse layout may shape its results its own way
        if not (tree.dtype.is_floating_point or tree.dtype.is_complex):
            return False
        parts.append(TensorMeta.of(tuple(tree.shape), tree.dtype, tree.device))
    elif kind is slice:
        parts.append((slice, tree.start, tree.stop, tree.step))
        return all(type(v) in (type(None), int) for v in (tree.start, tree.stop, tree.step))
    elif kind in _PLAIN or tree is Ellipsis:
        parts.append((kind, tree))
    else:
        return False
    return True


def _named(kind: type) -> bool:
    """Whether ``kind`` is a named tuple class (PyTorch's return types take a sequence)."""
    return hasattr(kind, "_fields") and kind.__module__ != "torch.return_types"


def _made(kind: type, items: list[Any]) -> Any:
    """A sequence of type ``kind`` holding ``items``: a named tuple takes them by position."""
    return kind(*items) if _named(kind) else kind(items)


class Fields:
    """The output structure of an op that returns a named tuple (a ``bf.function``'s
    ``NT(a, b)``): made from its tensors by position."""

    __slots__ = ("kind",)

    def __init__(self, kind: type) -> None:
        self.kind = kind

    def __call__(self, outs: list[Any]) -> Any:
        return self.kind(*outs)


class WithNones:
    """The output structure of an op that returns ``None`` among its tensors (``(out, None)``
    from ``multi_head_attention_forward`` with ``need_weights=False``): its node has the
    tensors alone (see :meth:`drop`), and the recorder gives the caller the Nones back."""

    __slots__ = ("kind", "nones")

    def __init__(self, kind: type, nones: tuple[int, ...]) -> None:
        self.kind, self.nones = kind, nones

    def __call__(self, outs: list[Any]) -> Any:
        items: list[Any] = list(outs)
        for position in self.nones:
            items.insert(position, None)
        return tuple(items) if self.kind is tuple else _made(self.kind, items)

    def drop(self, func: Any) -> Any:
        """``func`` returning its tensors alone, in order: the op the node runs."""

        def tensors_of(*args: Any, **kwargs: Any) -> tuple[Tensor, ...]:
            return tuple(o for o in func(*args, **kwargs) if o is not None)

        tensors_of.__name__ = getattr(func, "__name__", "op")
        return tensors_of


def infer_outputs(
    func: Any,
    eager: Any,
    name: str,
    site: str,
    targs: Any,
    tkwargs: Any,
    in_metas: tuple[TensorMeta, ...],
    meta_cache: dict[int, tuple[Tensor, Tensor]],
) -> Outputs:
    """The output(s) of one call on one instance: ``(multi, ((shape, dtype), ...))``.

    ``multi`` is ``None`` for one tensor, else the type of the sequence the op returns.
    Shapes come from meta tensors or from zeros, once per process for each op, argument
    template and input metas (:func:`inference_key`). ``eager``, when given, is the
    one-instance function to run on zeros instead of ``func`` (a ``bf.function``'s user
    code, which may not run on meta tensors).
    """
    key = None if eager is not None else inference_key(func, targs, tkwargs, in_metas)
    if key is not None and (known := _OUTPUTS.get(key)) is not None:
        return known
    out = _run_for_shapes(func, eager, name, site, targs, tkwargs, in_metas, meta_cache)
    found: Outputs
    with torch._C.DisableTorchFunction():  # the recorder's own reads: not the user's
        if isinstance(out, Tensor):
            found = (None, ((tuple(out.shape), out.dtype),))
        else:
            nones = tuple(i for i, o in enumerate(out) if o is None)
            kind: Any = WithNones(type(out), nones) if nones else type(out)
            if not nones and _named(kind):
                kind = Fields(kind)
            found = (kind, tuple((tuple(o.shape), o.dtype) for o in out if o is not None))
    if key is not None:
        if len(_OUTPUTS) >= _MAX_OUTPUTS:
            _OUTPUTS.clear()  # rare: a process seeing this many kinds of call
        _OUTPUTS[key] = found
    return found


_ZEROS_NOTE = (
    "A bf.function runs once on zeros of its inputs' shapes, to learn its outputs' shapes; "
    "one that cannot take zeros (a Cholesky factor, an inverse) cannot be a bf.function: "
    "call its ops directly, which batch_map records one by one."
)


def _takes_other_values(
    eager: Any, targs: Any, tkwargs: Any, in_metas: tuple[TensorMeta, ...]
) -> bool:
    """Whether a ``bf.function`` that failed on zeros runs on other values (normal floats)."""
    made = [
        torch.randn(m.shape, dtype=m.dtype, device=m.device)
        if m.dtype.is_floating_point
        else torch.ones(m.shape, dtype=m.dtype, device=m.device)
        for m in in_metas
    ]
    try:
        with torch.no_grad():
            eager(*fill(_copies(targs), made), **fill(_copies(tkwargs), made))
    except Exception:  # noqa: BLE001 - it does not: the error is not about zeros
        return False
    return True


def _run_for_shapes(
    func: Any,
    eager: Any,
    name: str,
    site: str,
    targs: Any,
    tkwargs: Any,
    in_metas: tuple[TensorMeta, ...],
    meta_cache: dict[int, tuple[Tensor, Tensor]],
) -> Any:
    # autocast picks dtypes by the device's own kernels: neither the rules below nor meta
    # tensors know them, so under autocast the op runs on zeros on its device
    autocast = torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda")
    with torch._C.DisableTorchFunction():
        out = None if autocast else known_shape(func, targs, tkwargs, in_metas)
        on_meta = eager is None and not autocast
        if out is None and on_meta and _small(targs, tkwargs, in_metas):
            # real zeros first: an op's first run on meta tensors can cost half a second of
            # imports; values never matter here, only shapes and dtypes
            out = _try_zeros(func, targs, tkwargs, in_metas)
        if out is None and on_meta:
            metas = [torch.empty(m.shape, dtype=m.dtype, device="meta") for m in in_metas]
            try:
                out = func(
                    *fill(_to_meta(targs, meta_cache), metas),
                    **fill(_to_meta(tkwargs, meta_cache), metas),
                )
            except _NOT_INPUT_ERRORS as error:
                if not isinstance(error, NotImplementedError):
                    raise
                out = None
            except _INPUT_ERRORS as error:
                if "meta" not in str(error).lower():
                    raise shape_error(name, site, in_metas, error) from error
        if out is None:
            zeros = [torch.zeros(m.shape, dtype=m.dtype, device=m.device) for m in in_metas]
            try:
                with torch.no_grad():
                    out = (eager or func)(
                        *fill(_copies(targs), zeros), **fill(_copies(tkwargs), zeros)
                    )
            except (RecursionError, MemoryError, BatchfoldError):  # ours: clear as it is
                raise
            except _INPUT_ERRORS as error:
                found = shape_error(name, site, in_metas, error)
                if eager is not None and _takes_other_values(eager, targs, tkwargs, in_metas):
                    add_note(found, _ZEROS_NOTE)
                raise found from error
    ok = isinstance(out, Tensor) or (
        isinstance(out, (tuple, list))
        and any(isinstance(o, Tensor) for o in out)
        and all(o is None or isinstance(o, Tensor) for o in out)
    )
    if not ok:
        raise UnsupportedOpError(
            f"{name} at {site} returns {type(out).__name__}, not a tensor or a tuple of "
            "tensors, so it cannot be recorded lazily."
        )
    return out
