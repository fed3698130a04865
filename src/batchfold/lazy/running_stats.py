"""Batch and instance normalisation in training mode inside ``batch_map``: running statistics.

Eagerly, each call of a ``BatchNorm`` layer in training mode moves the layer's running mean and
variance toward its input's statistics, in place, one call after the other; with a momentum
below 1 the buffers end up depending on the order of the calls. ``batch_map`` runs a batch's
calls together, in an order of its own (a step per shape, or per depth), so it cannot let the
op write the buffers. Such a call is recorded as the same normalisation without running
statistics (its output never reads them in training mode) and, beside it, its input's mean
and unbiased variance per channel. Once the batch has run, :meth:`RunningStats.apply` moves
the buffers call by call in the order the calls were recorded, which is eager PyTorch's order
as long as no instance waits for a value: so a batch that has both is refused. So is any other
use of buffers that such a call moves (evaluation-mode calls, reads) in the same batch: eagerly
it would see them moved, or partly moved. If the function raises, the buffers do not move
(eagerly, the calls before the error would have moved them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F

from ..errors import UnsupportedOpError
from ..ops_matrix import normalisation_arguments
from .sites import user_site
from .tensor import Lazy

Tensor = torch.Tensor
_C_FORMS = {torch.batch_norm: F.batch_norm, torch.instance_norm: F.instance_norm}
NORMALISATIONS = frozenset((F.batch_norm, F.instance_norm, *_C_FORMS))
# torch.batch_norm's and torch.instance_norm's arguments, by F.batch_norm's names
_C_NAMES = ("input", "weight", "bias", "running_mean", "running_var", "training", "momentum", "eps")
_REDUCED = (torch.float16, torch.bfloat16)  # eager's statistics: in float32 for these, else float64
_SYNCS = (
    "instances then record in turns, not in eager order, and the statistics would move in "
    "another order. Read values outside batch_map, or run the layer in evaluation mode there."
)


_same_version: Any = torch.autograd.grad_mode._unsafe_preserve_version_counter


def _memory(t: Tensor) -> int:
    """Where ``t``'s storage lives (with the recorder's mode off: a getter through it)."""
    with torch._C.DisableTorchFunction():
        return t.untyped_storage().data_ptr()


@dataclass
class _Update:
    mean_buffer: Tensor
    var_buffer: Tensor
    momentum: float
    mean: Lazy | Tensor | None  # None for a call on no values, which moves nothing
    var: Lazy | Tensor | None


def _bind(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The F function and its arguments by name (``training`` for ``use_input_stats``)."""
    if func in _C_FORMS:
        named: dict[str, Any] = dict(zip(_C_NAMES, args, strict=False))
        named.update(kwargs)
        func = _C_FORMS[func]
    else:
        named = dict(normalisation_arguments(func, args, kwargs))
    if "use_input_stats" in named:
        named["training"] = named.pop("use_input_stats")
    return func, named


class RunningStats:
    """The running-statistics updates of one ``batch_map``, applied after its last run."""

    def __init__(self) -> None:
        self.pending: list[_Update] = []
        # the memory of the buffers pending updates move (their storages: a view or a detached
        # alias of one, state_dict()'s say, reads it too) -> the op's name
        self.buffers: dict[int, str] = {}

    def record(self, rec: Any, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A normalisation call with running statistics: its output, recorded as described
        above; ``None`` for a call the recorder takes as any other (no running statistics,
        or evaluation mode on buffers no training call of this batch moves)."""
        form, named = _bind(func, args, kwargs)
        mean_buffer, var_buffer = named.get("running_mean"), named.get("running_var")
        if mean_buffer is None and var_buffer is None:
            return None
        name, site = form.__name__, user_site()
        if mean_buffer is None or var_buffer is None:
            raise ValueError(
                "running_mean and running_var must either both be None or neither be None"
            )
        if type(mean_buffer) is Lazy or type(var_buffer) is Lazy:
            raise UnsupportedOpError(
                f"{name} at {site} with running statistics computed inside the function: it "
                "would write them in place; pass buffers from outside (a module's)"
            )
        if not named.get("training", False):
            self.refuse_use((mean_buffer, var_buffer), f"{name} in evaluation mode")
            return None
        if not rec.moves_running_stats:
            raise UnsupportedOpError(
                f"{name} at {site} in training mode with running statistics inside a block "
                "Function: the statistics would not move. Run the layer in evaluation mode "
                "there, or write the model for batch_map."
            )
        if rec.driver.syncs:
            raise UnsupportedOpError(
                f"{name} at {site} in training mode with running statistics, after a value "
                "read (a sync point): " + _SYNCS
            )
        x = named["input"]
        shape = torch.Size(x._meta.shape if type(x) is Lazy else x.shape)  # plain numbers
        if len(shape) < 2:
            raise ValueError(f"{name} at {site} needs an input of two or more dimensions")
        per_channel = shape[0] if name == "batch_norm" else 1
        for size in shape[2:]:
            per_channel *= size
        if per_channel == 1:  # as F.batch_norm and F.instance_norm say it eagerly
            what = "value per channel" if name == "batch_norm" else "spatial element"
            raise ValueError(f"Expected more than 1 {what} when training, got input size {shape}")
        momentum = named.get("momentum", 0.1)
        if momentum is None or type(momentum) is Lazy:  # PyTorch's parser takes numbers only
            raise TypeError(
                f"{name}(): argument 'momentum' must be float, not {type(momentum).__name__}"
            )
        if rec.trace is not None:  # a cached call would not run this again: never cache it
            rec.trace.refuse("moves running statistics in place (normalisation in training)")
        weight, bias, eps = named.get("weight"), named.get("bias"), named.get("eps", 1e-5)
        out = rec.call(form, (x, None, None, weight, bias, True, 0.0, eps), {})
        mean = var = None  # no values: eagerly the statistics do not move
        if per_channel:
            mean, var = self._statistics(rec, x, name, len(shape))
        self.pending.append(_Update(mean_buffer, var_buffer, float(momentum), mean, var))
        self.buffers[_memory(mean_buffer)] = self.buffers[_memory(var_buffer)] = name
        return out

    @staticmethod
    def _statistics(rec: Any, x: Any, name: str, rank: int) -> tuple[Any, Any]:
        """Mean and unbiased variance per channel, in the precision eager's update uses."""
        precise = torch.float32 if x.dtype in _REDUCED else torch.float64
        with torch.no_grad():
            if x.dtype != precise:
                x = rec.call(Tensor.to, (x, precise), {})
            if name == "batch_norm":
                dims = (0, *range(2, rank))
                var, mean = rec.call(torch.var_mean, (x, dims), {"correction": 1})
            else:  # per instance and channel, then averaged, as instance_norm moves them
                var, mean = rec.call(torch.var_mean, (x, tuple(range(2, rank))), {"correction": 1})
                var, mean = rec.call(torch.mean, (var, 0), {}), rec.call(torch.mean, (mean, 0), {})
        return mean, var

    def refuse_use(self, tensors: Any, what: str) -> None:
        """Refuse ``what`` (a call, a read) on ``tensors`` if a training call of this batch
        moves one of them: eagerly it sees them moved."""
        for t in tensors:
            if type(t) in (list, tuple):  # torch.stack([m.running_mean, ...])
                self.refuse_use(t, what)
            elif isinstance(t, Tensor) and type(t) is not Lazy and _memory(t) in self.buffers:
                raise UnsupportedOpError(
                    f"{what} at {user_site()} uses running statistics that a "
                    f"{self.buffers[_memory(t)]} call of this batch_map in training mode moves: "
                    "eagerly it sees them moved (or partly moved), but batch_map moves them "
                    "after the batch has run. Use them outside batch_map."
                )

    def refuse_reads(self, graph: Any) -> None:
        """Before the batch runs: refuse a recorded op that reads buffers a training call
        moves (recorded before the call or after it: either is refused)."""
        if not self.pending:
            return
        for pool in graph.touched:
            sig = graph.signatures[pool]
            for t, _ in sig.shared:
                if _memory(t) in self.buffers:
                    raise UnsupportedOpError(
                        f"{sig.name} at {sig.site} reads running statistics that a "
                        f"{self.buffers[_memory(t)]} call of this batch_map in training mode moves: "
                        "batch_map moves them after the batch has run, so it cannot give "
                        "what eager code reads. Read them outside batch_map."
                    )

    def refuse_sync(self, what: str) -> None:
        """Refuse a value read (a sync point) once a training call has recorded an update."""
        if self.pending:
            raise UnsupportedOpError(
                f"{what} at {user_site()} reads a value after a normalisation in training mode "
                "with running statistics: " + _SYNCS
            )

    def apply(self, values: list[Tensor]) -> None:
        """Move the buffers in the order of the calls: ``values`` are the lazy statistics of
        :meth:`lazies`, in its order."""
        pending, self.pending, self.buffers = self.pending, [], {}
        computed = iter(values)
        with torch.no_grad():
            for u in pending:
                if u.mean is None or u.var is None:
                    continue
                mean = cast(Tensor, next(computed) if type(u.mean) is Lazy else u.mean)
                var = cast(Tensor, next(computed) if type(u.var) is Lazy else u.var)
                m = u.momentum
                for buffer, stat in ((u.mean_buffer, mean), (u.var_buffer, var)):
                    moved = m * stat + (1 - m) * buffer.to(stat.dtype)
                    with _same_version(buffer):  # eager's kernel moves them without a bump,
                        buffer.copy_(moved.to(buffer.dtype))  # so saved tensors stay valid

    def lazies(self) -> list[Lazy]:
        """The pending updates' lazy statistics, call by call (mean, then variance)."""
        found: list[Lazy] = []
        for u in self.pending:
            found.extend(s for s in (u.mean, u.var) if type(s) is Lazy)
        return found
