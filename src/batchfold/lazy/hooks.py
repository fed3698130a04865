"""Where ``batch_map`` hooks into PyTorch while it records.

:func:`install` routes every ``nn.Module`` call through the module cache of this thread's
recorder (:mod:`.macros`) and PyTorch's Python-level functions straight to the recorder
(:mod:`.dispatch`); :func:`uninstall` puts PyTorch's own back. Calls are counted, so that a
``batch_map`` nested in another's function leaves the hooks in place.

The cache takes the place of ``nn.Module._call_impl``, which ``nn.Module.__call__`` calls,
rather than of ``__call__``: a change of ``__call__`` updates the call slot of every
``nn.Module`` subclass, about 0.4 ms each way on each ``batch_map`` call, and leaves slower
attribute lookups behind it. For that reason ``nn.Module.__setattr__``, which notes the
modules changed while ``batch_map`` records (:mod:`.module_state`), is replaced once, by the
first ``install``, and stays: outside ``batch_map`` it only calls PyTorch's.

Once ``torch.compile`` is in use in the process (``torch._dynamo`` imported), the hooks also
set ``torch.compiler.set_stance("force_eager")`` while they are in place: a compiled module
or function called inside ``batch_map``'s function then runs its own Python code, which
records as any other, where its compiled form would meet lazy tensors it cannot trace (the
stance is the process's, so compiled code in other threads runs eagerly meanwhile too, and a
stance the function sets lasts only until ``batch_map`` returns). Called from code that
``torch.compile`` traces, ``batch_map`` runs as a call it does not trace (see :mod:`.api`),
and the stance stays as it is.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import warnings
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as _TORCH_MODULE

from . import dispatch
from .context import THREAD
from .lazy_trees import has_lazy
from .macros import MISSED
from .module_state import ACTIVE, forget_sets, module_setattr, note_member_swaps
from .ragged_macros import ORIGINAL_CALL
from .refusals import backward_hooks, refuse_backward_hooks, refuse_uninitialized
from .semantics import own_hooks

__all__ = ["install", "uninstall"]

_INSTALLED = [0]
_LOCK = threading.Lock()
_IDENTITY = nn.Identity
_STANCE: list[Any] = []  # the eager stance set by the first install, undone by the last

# the hooks registered for every module (``register_module_forward_hook``): dicts PyTorch
# changes in place and never replaces, read on every call
_GLOBAL_HOOKS = (
    _TORCH_MODULE._global_forward_hooks,
    _TORCH_MODULE._global_forward_pre_hooks,
    _TORCH_MODULE._global_backward_hooks,
    _TORCH_MODULE._global_backward_pre_hooks,
)


def _module_call(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    active = getattr(THREAD, "active", None)  # active_recorder(), inline
    rec = active[-1] if active else None
    if rec is None or rec.modules is None or rec.trace is not None or any(_GLOBAL_HOOKS):
        if rec is not None:
            lazy = has_lazy(args, kwargs)
            if not refuse_uninitialized(module, lazy):
                return _making_parameters(module, args, kwargs)
            if lazy and backward_hooks(module):
                return _hooked(rec, module, args, kwargs)
        return ORIGINAL_CALL(module, *args, **kwargs)  # global hooks run on every call: op by op
    if args and not kwargs:
        if type(module) is _IDENTITY and len(args) == 1 and not own_hooks(module):
            return args[0]  # nn.Identity(x), the usual stand-in for dropout 0: as it returns
        found = rec.modules.hit(module, args)
        if found is not MISSED:
            return found
    if not has_lazy(args, kwargs):
        if not refuse_uninitialized(module, False):
            return _making_parameters(module, args, kwargs)
        return ORIGINAL_CALL(module, *args, **kwargs)
    if backward_hooks(module):
        return _hooked(rec, module, args, kwargs)
    return rec.modules.call(module, args, kwargs)


def _hooked(rec: Any, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A call on per-instance values of a module with backward hooks: refused where eagerly
    they would run (see ``refuse_backward_hooks``), else recorded op by op, without PyTorch's
    warning that the hooks need tensor outputs (they would not run eagerly either)."""
    refuse_backward_hooks(module, args, kwargs, rec.graph.grad_free)
    if rec.modules is not None:
        rec.modules.misses[f"{type(module).__name__}: it has backward hooks"] += 1
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="For backward hooks to be called")
        return ORIGINAL_CALL(module, *args, **kwargs)


def _making_parameters(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The first call of a lazy module on tensors from outside: run as eagerly, the recorder
    off, so that its parameters are made as tensors, not per-instance constants."""
    with torch._C.DisableTorchFunction():
        return ORIGINAL_CALL(module, *args, **kwargs)


def install() -> None:
    """Route ``nn.Module`` calls through the cache, and PyTorch's Python-level functions straight
    to the recorder (see :mod:`.dispatch`), compiled code to its eager form (see above);
    counted, for nested ``batch_map`` calls."""
    with _LOCK:
        if _INSTALLED[0] == 0 and "torch._dynamo" in sys.modules:
            # called from compiled code, set_stance refuses: the stance stays as it is
            with contextlib.suppress(RuntimeError):
                _STANCE.append(torch.compiler.set_stance("force_eager"))
        _INSTALLED[0] += 1  # nothing below raises: what was done is undone by uninstall
        nn.Module._call_impl = _module_call  # type: ignore[method-assign]
        if nn.Module.__setattr__ is not module_setattr:  # once a process (module_state.py)
            nn.Module.__setattr__ = module_setattr  # type: ignore[method-assign]
        note_member_swaps()  # every time: a library may have put back what it saved before
        ACTIVE[0] += 1
        dispatch.patch(True)


def uninstall() -> None:
    """Undo one :func:`install`; the last one restores ``nn.Module._call_impl`` and PyTorch's
    ``handle_torch_function``."""
    with _LOCK:
        _INSTALLED[0] -= 1
        ACTIVE[0] -= 1
        if _INSTALLED[0] == 0:
            nn.Module._call_impl = ORIGINAL_CALL  # type: ignore[method-assign]
            forget_sets()
            dispatch.patch(False)
            if _STANCE:
                _STANCE.pop().__exit__(None, None, None)  # the stance before install
