"""Per-instance constants: what a factory (``torch.tensor``, ``torch.zeros``...) makes inside ``batch_map``.

A factory call with no lazy argument runs at once and its result becomes a *source* node:
a node with no inputs whose per-instance value is its payload. ``torch.tensor(x)`` of a
Python number keeps only the number, and the batched step builds one tensor from all of
them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ..graph import Signature, TensorMeta
from ..ops import OpRule
from ..ragged import join_family
from .semantics import is_random
from .sites import func_name, user_site
from .tensor import Lazy

if TYPE_CHECKING:
    from .recorder import Recorder

Tensor = torch.Tensor

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


def _batched_source(sig: Signature, inputs: list[Tensor], n: int) -> Tensor:
    raise AssertionError("source steps are built by the executor from their payloads")


SOURCE = OpRule("source", _batched_source, cheap=True)


class SourceMaker:
    """Makes the source nodes of one recorder, one signature per kind of constant."""

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self._scalars: dict[tuple[Any, ...], tuple[Signature, TensorMeta]] = {}

    def make(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run a factory and make its result a lazy per-instance constant."""
        rec = self.rec
        graph = rec.graph
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
            cached = self._scalars.get(cache_key)
            if cached is not None:
                vid = graph.add(cached[0], (), rec.instance, args[0])
                if rec.trace is not None:
                    rec.trace.ops.append((cached[0], (), vid, args[0]))
                return Lazy(rec, vid, cached[1])
            dtype = (
                kwargs.get("dtype") or _SCALAR_DTYPES[type(args[0])] or torch.get_default_dtype()
            )
            # the device eager torch.tensor gives: the default one when none is named, with
            # its index ("cuda" is "cuda:0", as parameters report it)
            meta = TensorMeta.of((), dtype, torch.empty(0, device=kwargs.get("device")).device)
            kind, payload = "scalar", args[0]
        else:
            value = func(*args, **kwargs)
            if not isinstance(value, Tensor):
                return value
            meta = TensorMeta.of(tuple(value.shape), value.dtype, value.device)
            kind, payload = "tensor", value
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
            if rec.ragged:
                join_family(graph.families, sig, key)
        if cache_key is not None:
            self._scalars[cache_key] = (sig, meta)
        vid = graph.add(sig, (), rec.instance, payload)
        if rec.trace is not None:
            if is_random(func):
                rec.trace.refuse("draws random numbers in a factory")
            rec.trace.ops.append((sig, (), vid, payload))
        return Lazy(rec, vid, meta)
