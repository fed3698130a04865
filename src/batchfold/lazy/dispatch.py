"""A shorter way from PyTorch's Python-level functions to the recorder.

``F.cross_entropy``, ``F.relu``, ``F.softmax`` and the other functions PyTorch writes in Python
reach a ``TorchFunctionMode`` through ``torch.overrides.handle_torch_function``, which finds
the overloaded arguments and pops the mode in a context manager for the call: about as much
time as recording the call itself. While ``batch_map`` runs, :func:`handle` stands in for it
in the modules that call it (``torch.nn.functional``, ``torch.functional``, ``torch._tensor``):
when the only mode is this thread's recorder and a lazy tensor is among the arguments, the call
goes straight to the recorder, with the same function, arguments and keywords the mode would
get, and the mode off during the call, as PyTorch has it. Anything else takes PyTorch's own
path.

``torch.tensor`` of a Python number (``torch.tensor(word_id)``, ``torch.tensor(label)``: a
third of the calls of a per-node Tree-LSTM) is a C++ function that reaches the mode through
PyTorch's C++ dispatch; :func:`tensor` stands in for it in the ``torch`` namespace and takes
such a call straight to the recorder's source maker, as the mode would; :func:`as_tensor`
does the same for ``torch.as_tensor`` of a tensor or an array (a molecule's features).
:func:`none_or_dtype` lets attention layers take a mask made inside the function,
:func:`is_tensor` answers ``torch.is_tensor`` of a lazy value as eagerly, and
:func:`broadcast_all` gives distributions' numbers a lazy value's dtype as eagerly.

``F.cross_entropy`` (the per-node loss of tree and sequence models) spends as long in its own
Python prologue as in recording; :func:`cross_entropy` stands in for it in
``torch.nn.functional`` and hands the recorder exactly the call ``F.cross_entropy`` would hand
the mode.
"""

from __future__ import annotations

import sys
from numbers import Number
from typing import Any

import numpy as np
import torch
import torch._tensor
import torch.distributions.utils
import torch.functional
import torch.nn.functional
from torch.utils._device import _device_constructors

from . import refusals
from .context import active_recorder
from .lengths import Length, plain_lengths
from .tensor import Lazy

ORIGINAL = torch.overrides.handle_torch_function
ORIGINAL_TENSOR = torch._C._VariableFunctions.tensor  # pyright: ignore[reportAttributeAccessIssue]
ORIGINAL_AS_TENSOR: Any = torch.as_tensor
ORIGINAL_CROSS_ENTROPY: Any = torch.nn.functional.cross_entropy
ORIGINAL_NONE_OR_DTYPE: Any = torch.nn.functional._none_or_dtype
ORIGINAL_IS_TENSOR: Any = torch.is_tensor
ORIGINAL_BROADCAST_ALL: Any = torch.distributions.utils.broadcast_all
_DISTRIBUTIONS = [  # the modules that imported it
    module
    for name, module in list(sys.modules.items())
    if name.startswith("torch.distributions")
    and getattr(module, "broadcast_all", None) is ORIGINAL_BROADCAST_ALL
]
_MODULES = (torch.nn.functional, torch.functional, torch._tensor)
_stack_len = torch._C._len_torch_function_stack
_stack_at = torch._C._get_function_stack_at
Tensor = torch.Tensor
_pop = torch._C._pop_torch_function_stack
_push = torch._C._push_on_torch_function_stack
_mode_active = torch._C._is_torch_function_mode_enabled
_NUMBERS = frozenset((int, float, bool))


def handle(public_api: Any, relevant_args: Any, *args: Any, **kwargs: Any) -> Any:
    """``handle_torch_function`` with a fast path to this thread's recorder."""
    if _stack_len() == 1:
        for arg in relevant_args:
            if type(arg) is Lazy:
                rec = active_recorder()
                if rec is not None and _stack_at(0) is rec:
                    _pop()  # as PyTorch does for the call: the mode is off inside it
                    try:
                        return rec.__torch_function__(public_api, (), args, kwargs)
                    finally:
                        _push(rec)
                break
    return ORIGINAL(public_api, relevant_args, *args, **kwargs)


def tensor(data: Any, *args: Any, **kwargs: Any) -> Any:
    """``torch.tensor`` with a fast path for a Python number inside this thread's recorder.

    Taken only where the mode would get the call (the recorder is the one mode on, and on);
    the recorder's source maker declines what it does not handle (``requires_grad=True``, a
    ``device`` and a ``dtype`` it is not given as keywords), which then goes PyTorch's way.
    """
    if type(data) in _NUMBERS and not args and _mode_active() and _stack_len() == 1:
        rec = active_recorder()
        if rec is not None and not rec.closed and _stack_at(0) is rec:
            lazy = rec.sources.scalar(data, kwargs)
            if lazy is not None:
                return lazy
    return ORIGINAL_TENSOR(data, *args, **kwargs)


def as_tensor(data: Any, *, dtype: Any = None, device: Any = None) -> Any:
    """``torch.as_tensor`` with a fast path for a tensor or an array inside this thread's
    recorder: the per-instance constant the mode would make (a molecule's feature tensors,
    three calls per molecule, cost more than the rest of its recording), without the mode's
    way there."""
    if isinstance(data, (Tensor, np.ndarray)) and _mode_active() and _stack_len() == 1:
        rec = active_recorder()
        if rec is not None and not rec.closed and _stack_at(0) is rec:
            kwargs = {} if dtype is None else {"dtype": dtype}
            if device is not None:
                kwargs["device"] = device
            _pop()  # as PyTorch does for the call: the mode is off inside it
            try:
                return rec.sources.make(ORIGINAL_AS_TENSOR, (data,), kwargs)
            finally:
                _push(rec)
    return ORIGINAL_AS_TENSOR(data, dtype=dtype, device=device)


def cross_entropy(
    input: Any,
    target: Any,
    weight: Any = None,
    size_average: Any = None,
    ignore_index: int = -100,
    reduce: Any = None,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> Any:
    """``F.cross_entropy`` with a fast path for lazy logits inside this thread's recorder."""
    if type(input) is Lazy and _stack_len() == 1:
        rec = active_recorder()
        if rec is not None and _stack_at(0) is rec:
            kwargs = {}  # the defaults, left out: the recorder keys them in one go
            defaults = (
                weight is None
                and size_average is None
                and ignore_index == -100
                and reduce is None
                and reduction == "mean"
                and label_smoothing == 0.0
            )
            if defaults and rec.trace is None and not rec.closed:
                known = rec.known(ORIGINAL_CROSS_ENTROPY, (input, target))  # Recorder.call's
                if known is not None:
                    return known
            if not defaults:
                kwargs = {
                    "weight": weight,
                    "size_average": size_average,
                    "ignore_index": ignore_index,
                    "reduce": reduce,
                    "reduction": reduction,
                    "label_smoothing": label_smoothing,
                }  # as F.cross_entropy hands them to the mode
            _pop()
            try:
                return rec.__torch_function__(ORIGINAL_CROSS_ENTROPY, (), (input, target), kwargs)
            finally:
                _push(rec)
    return ORIGINAL_CROSS_ENTROPY(
        input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing
    )


def none_or_dtype(mask: Any) -> Any:
    """``F._none_or_dtype``, which attention layers ask of their masks, taking a lazy mask (a
    causal mask made inside the function): PyTorch's refuses all but tensors and ``None``."""
    if type(mask) is Lazy:
        return mask.dtype
    return ORIGINAL_NONE_OR_DTYPE(mask)


def is_tensor(obj: Any) -> bool:
    """``torch.is_tensor`` that answers ``True`` for a lazy value, as eagerly for the tensor
    it stands for (a branch on it took the other way)."""
    return type(obj) is Lazy or ORIGINAL_IS_TENSOR(obj)


def broadcast_all(*values: Any) -> Any:
    """``torch.distributions``' ``broadcast_all``, whose numbers take the dtype and device of
    the first tensor among the values: a lazy value counts as one, as eagerly the tensor it
    stands for (it is no ``torch.Tensor``, so ``Normal(x, 1.0)`` made its scale in the default
    dtype, and its entropy in that dtype too)."""
    first = next((v for v in values if type(v) is Lazy or isinstance(v, Tensor)), None)
    if type(first) is Lazy:
        options = {"dtype": first.dtype, "device": first.device}
        values = tuple(torch.tensor(v, **options) if isinstance(v, Number) else v for v in values)
    return ORIGINAL_BROADCAST_ALL(*values)


def _taking_lengths(name: str, original: Any) -> Any:
    def factory(*args: Any, **kwargs: Any) -> Any:
        if any(type(a) is Length for a in (*args, *kwargs.values())):
            args, kwargs = plain_lengths(args), plain_lengths(kwargs)
        return original(*args, **kwargs)

    factory.__name__ = name
    factory.__doc__ = (
        f"``torch.{name}`` that takes a traced call's ragged length (``x.size(0)``, see "
        "lazy/lengths.py) as its number, noting the use: PyTorch's argument parser refuses "
        "it before any mode sees it."
    )
    return factory


_LENGTH_FACTORIES = [
    (torch, name, getattr(torch, name), _taking_lengths(name, getattr(torch, name)))
    for name in ("arange", "linspace", "logspace", "tril_indices", "triu_indices")
]


def patch(on: bool) -> None:
    """Put :func:`handle` in place of PyTorch's (``on``), or PyTorch's back; the same for
    :func:`tensor` and ``torch.tensor``, :func:`cross_entropy` and ``F.cross_entropy``, and the
    calls :mod:`.refusals` stands in for.

    A stand-in goes only where PyTorch's own function is, and PyTorch's goes back only where
    the stand-in still is: a function the user put there (a wrapper that changes a default,
    or one that counts calls) stays, and is called inside ``batch_map`` as outside it.
    """
    if on:
        # a default device (torch.set_default_device) fills its set of factories, cached, on
        # first use: filled now, it holds PyTorch's torch.tensor and not the stand-in
        _device_constructors()
    swaps = [
        *((module, "handle_torch_function", ORIGINAL, handle) for module in _MODULES),
        (torch, "tensor", ORIGINAL_TENSOR, tensor),
        (torch, "as_tensor", ORIGINAL_AS_TENSOR, as_tensor),
        (torch.nn.functional, "cross_entropy", ORIGINAL_CROSS_ENTROPY, cross_entropy),
        (torch.nn.functional, "_none_or_dtype", ORIGINAL_NONE_OR_DTYPE, none_or_dtype),
        (torch, "is_tensor", ORIGINAL_IS_TENSOR, is_tensor),
        *(
            (module, "broadcast_all", ORIGINAL_BROADCAST_ALL, broadcast_all)
            for module in _DISTRIBUTIONS
        ),
        *_LENGTH_FACTORIES,
    ]
    for module, name, original, replacement in swaps:
        if getattr(module, name) is (original if on else replacement):
            setattr(module, name, replacement if on else original)
    refusals.patch(on)
