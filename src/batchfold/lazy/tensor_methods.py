"""The ``torch.Tensor`` methods of :class:`~.tensor.Lazy`, installed on it once.

Every method goes to the recorder as a call (``x.sum(0)`` records ``Tensor.sum``). In-place
forms (``x.add_(y)``, ``x += y``) record their out-of-place op and rebind ``x`` to the result
(``Recorder.write``); ``copy_``, ``fill_``, ``zero_`` and random fills (``normal_``...) write a
value made for them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .semantics import AUGMENTED, NOT_RECORDED
from .tensor import Lazy

Tensor = torch.Tensor


def _in_place(name: str, out_of_place: Any) -> Callable[..., Any]:
    def in_place(self: Lazy, *args: Any, **kwargs: Any) -> Lazy:
        if out_of_place is None:
            raise self._rec.unsupported_in_place(name)
        return self._rec.write(self, out_of_place, (self, *args), kwargs, f"{name}()")

    in_place.__name__ = name
    return in_place


def _overwrite(self: Lazy, value: Any, what: str) -> Lazy:
    """Write ``value`` over all of ``self`` (``copy_``, a random fill). Eagerly the result
    requires grad where ``self`` did (its history gets a zero gradient): for a floating-point
    ``self`` the new value is ``torch.where(False, self, value)``, which keeps that."""
    rec = self._rec
    dtype = self._meta.dtype
    if not (dtype.is_floating_point or dtype.is_complex):
        return rec.write(self, torch.Tensor.expand_as, (value, self), {}, what)
    if isinstance(value, (Lazy, Tensor)) and value.dtype != dtype:
        value = rec.call(Tensor.to, (value, dtype), {})  # as copy_ casts; where would promote
    keep = rec.call(torch.zeros_like, (self,), {"dtype": torch.bool})
    return rec.write(self, torch.where, (keep, self, value), {}, what)


def _copy_(self: Lazy, src: Any, non_blocking: bool = False) -> Lazy:
    return _overwrite(self, src, "copy_()")


def _fill_(self: Lazy, value: Any) -> Lazy:
    if type(value) is Lazy and not value.shape:  # full_like takes numbers: copy it, broadcast
        return self._rec.write(self, torch.Tensor.expand_as, (value, self), {}, "fill_()")
    return self._rec.write(self, torch.full_like, (self, value), {}, "fill_()")


def _zero_(self: Lazy) -> Lazy:
    return self._rec.write(self, torch.zeros_like, (self,), {}, "zero_()")


def _random_fill(name: str) -> Callable[..., Any]:
    """``x.normal_()``, ``x.uniform_(a, b)``...: fresh random numbers of ``x``'s shape, drawn
    at once by PyTorch's own kernel (the numbers eager code draws at this call), then written
    into ``x`` (distributions' ``rsample`` fills ``torch.empty(...)`` this way)."""

    def fill(self: Lazy, *args: Any, **kwargs: Any) -> Lazy:
        if any(type(a) is Lazy for a in (*args, *kwargs.values())):
            raise self._rec.unsupported_in_place(f"{name}() with per-instance arguments")
        meta = self._meta

        def random_fill() -> Tensor:  # a random source: a traced call drawing it is not cached
            with torch._C.DisableTorchFunction():
                empty = torch.empty(meta.shape, dtype=meta.dtype, device=meta.device)
                return getattr(empty, name)(*args, **kwargs)

        return _overwrite(self, self._rec.sources.make(random_fill, (), {}), f"{name}()")

    fill.__name__ = name
    return fill


_RANDOM_FILLS = (
    "normal_",
    "uniform_",
    "exponential_",
    "cauchy_",
    "log_normal_",
    "geometric_",
    "random_",
)
_SPECIAL_IN_PLACE = {
    "copy_": _copy_,
    "fill_": _fill_,
    "zero_": _zero_,
    **{name: _random_fill(name) for name in _RANDOM_FILLS},
}


def _method(name: str) -> Callable[..., Any]:
    func = getattr(torch.Tensor, name)

    def method(self: Lazy, *args: Any, **kwargs: Any) -> Any:
        return self._rec.call(func, (self, *args), kwargs)

    method.__name__ = name
    return method


def install_methods() -> None:
    """Give :class:`Lazy` every ``torch.Tensor`` method it does not define itself."""
    for name in dir(torch.Tensor):
        if name in NOT_RECORDED or name in Lazy.__dict__ or name in ("shape", "dtype", "device"):
            continue
        attr = getattr(torch.Tensor, name, None)
        if name in _SPECIAL_IN_PLACE:
            setattr(Lazy, name, _SPECIAL_IN_PLACE[name])
        elif name in AUGMENTED:
            setattr(Lazy, name, _in_place(name, getattr(torch.Tensor, AUGMENTED[name], None)))
        elif not callable(attr) or isinstance(attr, type):
            continue
        elif name.endswith("_") and not name.startswith("_"):
            setattr(Lazy, name, _in_place(name, getattr(torch.Tensor, name[:-1], None)))
        else:
            setattr(Lazy, name, _method(name))
