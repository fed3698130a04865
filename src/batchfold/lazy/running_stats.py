"""Batch and instance normalisation in training mode inside ``batch_map``: running statistics.

Eagerly, each call of a ``BatchNorm`` layer in training mode moves the layer's running mean and
variance toward its input's statistics, in place, one call after the other; with a momentum
below 1 the buffers end up depending on the order of the calls. ``batch_map`` runs a batch's
calls together, in an order of its own (a step per shape, or per depth), so it cannot let the
op write the buffers. Such a call is recorded as the same normalisation without running
statistics (its output never reads them in training mode) and, beside it, its input's mean
and unbiased variance per channel. Once the batch has run, :meth:`RunningStats.apply` moves
the buffers call by call in eager PyTorch's order: instance by instance, each instance's calls
in its own order. A call in evaluation mode on buffers that an earlier call of the same batch
moves is refused: eagerly it reads the moved buffers, which are moved only at the end.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..errors import UnsupportedOpError
from .sites import user_site
from .tensor import Lazy

Tensor = torch.Tensor
_F_FORMS = {F.batch_norm: F.batch_norm, F.instance_norm: F.instance_norm}
_C_FORMS = {torch.batch_norm: F.batch_norm, torch.instance_norm: F.instance_norm}
NORMALISATIONS = frozenset((*_F_FORMS, *_C_FORMS))
# torch.batch_norm's and torch.instance_norm's arguments, by F.batch_norm's names
_C_NAMES = ("input", "weight", "bias", "running_mean", "running_var", "training", "momentum", "eps")
_SIGNATURES = {f: inspect.signature(f) for f in _F_FORMS}


@dataclass
class _Update:
    instance: int  # eager order: instance by instance, then the order of recording
    order: int
    mean_buffer: Tensor | None
    var_buffer: Tensor | None
    momentum: float
    mean: Lazy | None  # None for a call on no values, which moves nothing (but counts)
    var: Lazy | None


def _bind(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The F function and its arguments by name (``training`` for ``use_input_stats``)."""
    if func in _C_FORMS:
        return _C_FORMS[func], dict(zip(_C_NAMES, args, strict=False))
    bound = _SIGNATURES[func].bind(*args, **kwargs)
    bound.apply_defaults()
    named = dict(bound.arguments)
    if "use_input_stats" in named:
        named["training"] = named.pop("use_input_stats")
    return func, named


class RunningStats:
    """The running-statistics updates of one ``batch_map``, applied after its last run."""

    def __init__(self) -> None:
        self.pending: list[_Update] = []
        self.buffers: set[int] = set()  # ids of the buffers pending updates move

    def record(self, rec: Any, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A normalisation call with running statistics: its lazy output, recorded as described
        above; ``None`` for a call the recorder takes as any other."""
        form, named = _bind(func, args, kwargs)
        x, mean_buffer, var_buffer = named["input"], named["running_mean"], named["running_var"]
        if (mean_buffer is None and var_buffer is None) or type(x) is not Lazy:
            return None
        name = form.__name__
        if type(mean_buffer) is Lazy or type(var_buffer) is Lazy:
            raise UnsupportedOpError(
                f"{name} at {user_site()} with running statistics computed inside the function: "
                "it would write them in place; pass buffers from outside (a module's)"
            )
        if not named["training"]:
            if id(mean_buffer) in self.buffers or id(var_buffer) in self.buffers:
                raise UnsupportedOpError(
                    f"{name} at {user_site()} in evaluation mode reads running statistics that "
                    "an earlier call of this batch_map in training mode moves: eagerly it sees "
                    "them moved, but batch_map moves them after the batch has run. Switch the "
                    "module's mode outside batch_map."
                )
            return None
        shape = torch.Size(x._meta.shape)  # plain numbers, also in a traced call on sequences
        if len(shape) < 2:
            raise ValueError(f"{name} at {user_site()} needs an input of two or more dimensions")
        per_channel = shape[0] if name == "batch_norm" else 1
        for size in shape[2:]:
            per_channel *= size
        if per_channel == 1:  # as F.batch_norm and F.instance_norm say it eagerly
            what = "value per channel" if name == "batch_norm" else "spatial element"
            raise ValueError(f"Expected more than 1 {what} when training, got input size {shape}")
        if not rec.moves_running_stats:
            raise UnsupportedOpError(
                f"{name} at {user_site()} in training mode with running statistics inside a "
                "block Function: the statistics would not move. Run the layer in evaluation "
                "mode there, or write the model for batch_map."
            )
        if rec.trace is not None:  # a cached call would not run this again: never cache it
            rec.trace.refuse("moves running statistics in place (normalisation in training)")
        eps = named["eps"]
        out = rec.call(form, (x, None, None, named["weight"], named["bias"], True, 0.0, eps), {})
        dims = tuple(d for d in range(len(shape)) if d != 1) if name == "batch_norm" else None
        mean = var = None  # no values: eagerly the statistics do not move
        with torch.no_grad():
            if per_channel and dims is not None:
                var, mean = rec.call(torch.var_mean, (x, dims), {"correction": 1})
            elif per_channel:  # per instance and channel, then averaged, as instance_norm does
                dims = tuple(range(2, len(shape)))
                var, mean = rec.call(torch.var_mean, (x, dims), {"correction": 1})
                var, mean = rec.call(torch.mean, (var, 0), {}), rec.call(torch.mean, (mean, 0), {})
        momentum = named["momentum"]
        order = len(self.pending)
        self.pending.append(
            _Update(rec.instance, order, mean_buffer, var_buffer, momentum, mean, var)
        )
        self.buffers.update(id(t) for t in (mean_buffer, var_buffer) if t is not None)
        return out

    def apply(self, values: list[Tensor]) -> None:
        """Move the buffers: ``values`` are the pending updates' means, then their variances.

        A layer with ``momentum=None`` passes a different momentum to each call (one over the
        number of calls so far), made in the order the calls were recorded: the momenta of one
        pair of buffers go to its calls in eager order instead.
        """
        pending, self.pending, self.buffers = self.pending, [], set()
        moving = [u for u in pending if u.mean is not None]
        n = len(moving)
        stats = {id(u): (values[i], values[n + i]) for i, u in enumerate(moving)}
        groups: dict[tuple[int, int], list[_Update]] = {}
        for u in pending:
            groups.setdefault((id(u.mean_buffer), id(u.var_buffer)), []).append(u)
        with torch.no_grad():
            for group in groups.values():
                momenta = [u.momentum for u in group]
                eager_order = sorted(group, key=lambda u: (u.instance, u.order))
                for u, m in zip(eager_order, momenta, strict=True):
                    if u.mean is None:
                        continue
                    mean, var = stats[id(u)]
                    for buffer, stat in ((u.mean_buffer, mean), (u.var_buffer, var)):
                        if buffer is not None:
                            moved = m * stat.double() + (1 - m) * buffer.double()
                            buffer.copy_(moved.to(buffer.dtype))

    def lazies(self) -> list[Lazy]:
        """The pending updates' means, then their variances (see :meth:`apply`)."""
        means = [u.mean for u in self.pending if u.mean is not None]
        return means + [u.var for u in self.pending if u.var is not None]
