"""Shape inference for a new kind of node: its argument template, checks, and output metas.

Output shapes and dtypes come from running the op once on meta tensors (or on zeros where
the op has no meta kernel), so they are eager PyTorch's own, promotion rules included.
Errors from the op become a :class:`~batchfold.errors.ShapeError` naming the user's line;
errors that are not about the inputs (a ``RecursionError``, ``MemoryError``) pass through.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..errors import DeviceError, DtypeError, ShapeError, UnsupportedOpError
from ..graph import Slot, TensorMeta
from ..ops import fill
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
    if len(floats) > 1:
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
    return ShapeError(
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


def _known_shape(func: Any, targs: Any, tkwargs: Any, in_metas: tuple[TensorMeta, ...]) -> Any:
    """The output of ``F.linear`` or ``F.embedding`` without running it.

    Their meta kernels' first use imports ``torch._dynamo`` (a fifth to over half a second),
    which would make every process's first ``batch_map`` slow; their weights are too large
    to run them on zeros instead.
    """
    if not targs or type(targs[0]) is not Slot:
        return None
    if func is F.embedding:
        return _embedding_shape(targs, tkwargs, in_metas)
    if func is not F.linear or tkwargs or len(targs) not in (2, 3):
        return None
    weight, bias = targs[1], targs[2] if len(targs) == 3 else None
    meta = in_metas[0]
    if not isinstance(weight, Tensor) or weight.dim() != 2 or not meta.shape:
        return None
    if meta.shape[-1] != weight.shape[1] or meta.dtype != weight.dtype:
        return None
    if bias is not None and (not isinstance(bias, Tensor) or bias.shape != weight.shape[:1]):
        return None
    return torch.empty((*meta.shape[:-1], weight.shape[0]), dtype=meta.dtype, device="meta")


def _embedding_shape(targs: Any, tkwargs: Any, in_metas: tuple[TensorMeta, ...]) -> Any:
    """``F.embedding(index, weight)``: ``[*index.shape, dim]`` in the weight's dtype.

    Only the plain call (no ``max_norm``, which renormalises the weight in place).
    """
    weight = targs[1] if len(targs) > 1 else tkwargs.get("weight")
    max_norm = targs[3] if len(targs) > 3 else tkwargs.get("max_norm")
    index = in_metas[0]
    if len(in_metas) != 1 or max_norm is not None or index.dtype not in _INDEX_DTYPES:
        return None
    if not isinstance(weight, Tensor) or weight.dim() != 2:
        return None
    return torch.empty((*index.shape, weight.shape[1]), dtype=weight.dtype, device="meta")


_INDEX_DTYPES = (torch.int64, torch.int32)
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
            return func(*fill(targs, zeros), **fill(tkwargs, zeros))
    except (RecursionError, MemoryError):
        raise
    except Exception:  # the meta run below decides, and names the error
        return None


def infer_outputs(
    func: Any,
    eager: Any,
    name: str,
    site: str,
    targs: Any,
    tkwargs: Any,
    in_metas: tuple[TensorMeta, ...],
    meta_cache: dict[int, tuple[Tensor, Tensor]],
) -> Any:
    """Output(s) of one call on one instance, computed on meta tensors or on zeros.

    ``eager``, when given, is the one-instance function to run on zeros instead of ``func``
    (a ``bf.function``'s user code, which may not run on meta tensors).
    """
    with torch._C.DisableTorchFunction():
        out = _known_shape(func, targs, tkwargs, in_metas)
        if out is None and eager is None and _small(targs, tkwargs, in_metas):
            # real zeros first: an op's first run on meta tensors can cost half a second of
            # imports; values never matter here, only shapes and dtypes
            out = _try_zeros(func, targs, tkwargs, in_metas)
        if out is None and eager is None:
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
                    out = (eager or func)(*fill(targs, zeros), **fill(tkwargs, zeros))
            except (RecursionError, MemoryError):
                raise
            except _INPUT_ERRORS as error:
                raise shape_error(name, site, in_metas, error) from error
    ok = isinstance(out, Tensor) or (
        isinstance(out, (tuple, list)) and out and all(isinstance(o, Tensor) for o in out)
    )
    if not ok:
        raise UnsupportedOpError(
            f"{name} at {site} returns {type(out).__name__}, not a tensor or a tuple of "
            "tensors, so it cannot be recorded lazily."
        )
    return out
