"""What recorded code cannot do as eager code does: refused, with the way to write it.

Inside ``batch_map`` a value is a row of a batched tensor computed later, and gradients are
computed once the batch has run. So autograd's per-tensor features (``backward()``, hooks,
``.grad``, a leaf made with ``requires_grad_()``), a custom ``torch.autograd.Function`` (the
recorder sees its forward's ops, not its ``backward``: the gradient would be another),
entering ``torch.autocast`` (the ops run after the function has left it) and reseeding the
random generator per instance (random ops draw when the batch runs, for every instance at
once) cannot mean there what they mean eagerly; nor can a lazy tensor hidden in a container
the recorder does not look into (a named tuple given to ``torch.cat``). Each raises
:class:`~batchfold.errors.UnsupportedOpError` naming the file and line, not an
``AttributeError`` deep inside, nor a silently different number.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
from torch.nn.modules.lazy import LazyModuleMixin
from torch.utils._pytree import tree_leaves

from ..errors import UnsupportedOpError
from .context import active_recorder
from .lazy_trees import map_lazies
from .sites import func_name, user_site
from .tensor import Lazy

_AFTER = (
    "inside batch_map a value is a row of a batched tensor computed later, with no autograd "
    "history of its own; return it from the function and use the result instead"
)
_ATTRIBUTES = {
    "backward": "gradients are computed after batch_map has run the batch; return the loss "
    "and call backward() on the result (or on the sum of the results)",
    "register_hook": _AFTER,
    "retain_grad": _AFTER,
    "grad": _AFTER,
    "grad_fn": _AFTER,
    "is_leaf": _AFTER,
    "data": "use detach(), which batch_map records (and rebind the name, not .data)",
    "detach_": "batch_map cannot drop a value's history in place; rebind it: x = x.detach()",
    "requires_grad_": "a tensor made inside the function is not a leaf of its own; pass a "
    "tensor that requires grad in the instance and read it with torch.as_tensor(x): its "
    "gradient comes back to it (an nn.Module made inside the function makes its parameters "
    "so: make it outside, once, and call it inside)",
}
_PROPERTIES = frozenset(["grad", "grad_fn", "is_leaf", "data"])
REFUSED = _ATTRIBUTES  # what each refused attribute says (writes.py: torch.detach_(x) too)


def _refused(name: str, hint: str) -> Callable[..., Any]:
    def refuse(self: Lazy, *args: Any, **kwargs: Any) -> Any:
        raise UnsupportedOpError(f"{name} of a lazy tensor at {user_site()}: {hint}.")

    refuse.__name__ = name
    refuse.__doc__ = f"Refused inside ``batch_map``: {hint}."
    return refuse


for _name, _hint in _ATTRIBUTES.items():
    _made = _refused(_name, _hint)
    setattr(Lazy, _name, property(_made, _made) if _name in _PROPERTIES else _made)  # set too


def refuse_uninitialized(module: torch.nn.Module, per_instance: bool = True) -> bool:
    """Whether ``module`` has its parameters; a lazy module (``nn.LazyLinear``...) whose
    parameters are not made yet is refused if called on per-instance values (``per_instance``):
    its parameters would be made from one (PyTorch's own error follows from deep inside
    otherwise). ``False``: a call on tensors from outside, which makes them (see hooks.py)."""
    lazy = cast(Any, module) if isinstance(module, LazyModuleMixin) else None
    if lazy is None or not lazy.has_uninitialized_params():
        return True
    if per_instance:
        raise UnsupportedOpError(
            f"{type(module).__name__} at {user_site()} has parameters not made yet (a lazy "
            "module): inside batch_map its first call would make them from a per-instance "
            "value. Call it once outside batch_map, on one instance, to make them."
        )
    return False


_GLOBAL_BACKWARD = (
    torch.nn.modules.module._global_backward_hooks,
    torch.nn.modules.module._global_backward_pre_hooks,
)


def backward_hooks(module: torch.nn.Module) -> bool:
    """Whether ``module`` has backward hooks (or pre-hooks), or every module has."""
    return bool(module._backward_hooks or module._backward_pre_hooks or any(_GLOBAL_BACKWARD))


def refuse_backward_hooks(module: torch.nn.Module, args: Any, kwargs: Any, free: Any) -> None:
    """Refuse a call on per-instance values of a module with backward hooks (its own, or
    registered for every module) where eagerly they would run (in grad mode, an input or a
    parameter requiring grad; ``free``: the value ids that do not): they would not, as the
    call's values are rows of batched tensors computed later, with no call of their own."""
    if not backward_hooks(module) or not torch.is_grad_enabled():
        return
    lazies: list[Lazy] = []
    map_lazies(lazies.append, (args, kwargs))
    if any(x._vid not in free for x in lazies) or any(p.requires_grad for p in module.parameters()):
        raise UnsupportedOpError(
            f"{type(module).__name__} at {user_site()} has backward hooks (or backward hooks "
            "registered for every module), which would not run inside batch_map: its calls' "
            "values are rows of batched tensors, computed later. Register a hook on the "
            "tensors batch_map returns (result.register_hook), or remove the module's."
        )


def refuse_hidden(func: Any, args: Any, kwargs: Any) -> Any:
    """``func``, once sure that no lazy tensor hides in a container the recorder does not
    look into (a named tuple): run as a call on shared tensors it would come back forever."""
    if any(type(x) is Lazy for x in tree_leaves((args, kwargs))):
        raise UnsupportedOpError(
            f"{func_name(func)} at {user_site()} gets a lazy tensor inside a container other "
            "than a list, tuple or dict (a named tuple?); pass them in a list or a tuple."
        )
    return func


def function_apply(cls: Any, *args: Any, **kwargs: Any) -> Any:
    """``torch.autograd.Function.apply`` on per-instance values inside ``batch_map``: refused
    where its ``backward`` would matter (in grad mode, with an argument that requires grad, a
    per-instance value or a tensor from outside such as a weight); else its forward runs as
    eagerly, without grad and with a context that keeps nothing for a backward."""
    if active_recorder() is None:
        return ORIGINAL_APPLY.__func__(cls, *args, **kwargs)
    lazies: list[Lazy] = []
    map_lazies(lazies.append, (args, kwargs))
    if not lazies:
        return ORIGINAL_APPLY.__func__(cls, *args, **kwargs)
    tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    if torch.is_grad_enabled() and any(t.requires_grad for t in (*lazies, *tensors)):
        raise UnsupportedOpError(
            f"{cls.__name__}.apply at {user_site()}: a custom autograd Function on "
            "per-instance values, with an argument that requires grad. batch_map sees the ops "
            "of its forward, not its backward, so gradients would differ from eager PyTorch's. "
            "Call it on batched tensors instead: wrap the code that calls it in "
            "bf.function(..., batched=True)."
        )
    ctx = _NoBackward(len(args))
    with torch.no_grad():
        if _has_setup_context(cls):  # forward(*args) with setup_context(ctx, inputs, output)
            out = cls.forward(*args, **kwargs)
            cls.setup_context(ctx, args, out)
            return out
        return cls.forward(ctx, *args, **kwargs)


def _has_setup_context(cls: Any) -> bool:
    return getattr(cls.setup_context, "__func__", cls.setup_context) is not getattr(
        torch.autograd.Function.setup_context, "__func__", torch.autograd.Function.setup_context
    )


class _NoBackward:
    """The context a custom Function's forward gets where no gradient flows through it: what
    it saves is kept as it is, for nothing (eager PyTorch's would not be used either)."""

    def __init__(self, inputs: int) -> None:
        self.needs_input_grad = (False,) * inputs
        self.saved_tensors: tuple[Any, ...] = ()
        self.materialize_grads = True

    def save_for_backward(self, *tensors: Any) -> None:
        """Keep ``tensors`` as ``saved_tensors``."""
        self.saved_tensors = tensors

    def save_for_forward(self, *tensors: Any) -> None:
        """Nothing: no forward-mode gradient flows either."""

    def mark_dirty(self, *tensors: Any) -> None:
        """Nothing: the forward's in-place writes were recorded as writes."""

    def mark_non_differentiable(self, *tensors: Any) -> None:
        """Nothing: no output requires grad."""

    def set_materialize_grads(self, value: bool) -> None:
        """Keep the setting, for nothing."""
        self.materialize_grads = value


def _reseed(original: Callable[..., Any]) -> Callable[..., Any]:
    name = original.__name__

    def reseed(*args: Any, **kwargs: Any) -> Any:
        rec = active_recorder()
        if rec is not None and rec.driver.in_instance and name == "set_default_dtype":
            raise UnsupportedOpError(
                f"torch.{name}() at {user_site()} inside batch_map's function: the calls "
                "recorded under one default dtype are replayed for instances under another. "
                "Set it before batch_map, or give dtypes explicitly (dtype=torch.float64)."
            )
        if rec is not None and rec.driver.in_instance:
            raise UnsupportedOpError(
                f"torch.{name}() at {user_site()} inside batch_map's function: random ops draw "
                "when the batch runs, for every instance at once, so a generator state set per "
                "instance would not reach them. Seed once before batch_map (each instance "
                "still draws numbers of its own)."
            )
        return original(*args, **kwargs)

    reseed.__name__, reseed.__doc__ = name, original.__doc__
    return reseed


def autocast_enter(self: Any) -> Any:
    """``torch.autocast.__enter__`` that refuses to change autocast inside the per-instance
    function: recorded ops run later, after the function has left the context."""
    rec = active_recorder()
    if rec is not None and rec.driver.in_instance:
        device = self.device
        same = torch.is_autocast_enabled(device) == self._enabled and (
            not self._enabled or torch.get_autocast_dtype(device) == self.fast_dtype
        )
        if not same:
            raise UnsupportedOpError(
                f"torch.autocast entered at {user_site()} inside batch_map's function: the "
                "recorded ops run after the function has left it. Enter autocast around the "
                "batch_map call instead, and every op runs under it."
            )
    return ORIGINAL_ENTER(self)


def validate_sample(self: Any, value: Any) -> Any:
    """``Distribution._validate_sample`` that names the way out for a lazy value, which its
    ``isinstance(value, torch.Tensor)`` check refuses with "must be a Tensor"."""
    if type(value) is Lazy:
        raise UnsupportedOpError(
            f"{type(self).__name__} at {user_site()} validates a value (log_prob, cdf) with "
            "isinstance(value, torch.Tensor), which a lazy value is not: inside batch_map, "
            f"make the distribution with validate_args=False ({type(self).__name__}(..., "
            "validate_args=False)); one made inside another (OneHotCategorical's Categorical) "
            "validates by default whatever the outer one was given: call "
            "torch.distributions.Distribution.set_default_validate_args(False) before batch_map."
        )
    return _BEFORE.get((_DISTRIBUTION, "_validate_sample"), ORIGINAL_VALIDATE)(self, value)


_DISTRIBUTION = torch.distributions.Distribution
ORIGINAL_VALIDATE: Any = _DISTRIBUTION._validate_sample
_AUTOCAST = torch.amp.autocast_mode.autocast
ORIGINAL_ENTER: Any = _AUTOCAST.__enter__
_FUNCTION = torch.autograd.Function
ORIGINAL_APPLY: Any = _FUNCTION.__dict__["apply"]  # a classmethod
_APPLY = classmethod(function_apply)
_SEEDING = [
    (space, name, getattr(space, name))
    for space in (torch, torch.random)
    for name in ("manual_seed", "seed", "set_rng_state")
] + [(torch, "set_default_dtype", torch.set_default_dtype)]
_RESEEDS = [(space, name, _reseed(original)) for space, name, original in _SEEDING]
_BEFORE: dict[tuple[Any, str], Any] = {}  # what the refusing forms stand in for while on


def patch(on: bool) -> None:
    """Put the refusing forms of ``Function.apply``, ``torch.autocast.__enter__``,
    ``Distribution._validate_sample``, the random generator's seeding (``torch.manual_seed``,
    ``torch.seed``, ``torch.set_rng_state``) and ``torch.set_default_dtype`` in place (``on``), or what was there before (PyTorch's, or a function the user put there)."""
    _FUNCTION.apply = _APPLY if on else ORIGINAL_APPLY  # type: ignore[method-assign]
    _AUTOCAST.__enter__ = autocast_enter if on else ORIGINAL_ENTER  # type: ignore[method-assign]
    current = _DISTRIBUTION.__dict__["_validate_sample"]
    if on and current is not validate_sample:
        _BEFORE[_DISTRIBUTION, "_validate_sample"] = current  # PyTorch's, or the user's
        _DISTRIBUTION._validate_sample = validate_sample  # type: ignore[method-assign]
    elif not on and current is validate_sample:
        before = _BEFORE.pop((_DISTRIBUTION, "_validate_sample"), ORIGINAL_VALIDATE)
        _DISTRIBUTION._validate_sample = before  # type: ignore[method-assign]
    for (space, name, original), (_, _, refusing) in zip(_SEEDING, _RESEEDS, strict=True):
        current = getattr(space, name)
        if on and current is not refusing:
            _BEFORE[space, name] = current
            setattr(space, name, refusing)
        elif not on and current is refusing:
            setattr(space, name, _BEFORE.pop((space, name), original))


_CHANNELS_LAST = (torch.channels_last, torch.channels_last_3d)


def refuse_channels_last(func: Any, kwargs: dict[str, Any]) -> None:
    """``x.contiguous(memory_format=torch.channels_last)`` on a per-instance value: its rows
    of a batched tensor have a layout of their own, and whether eager would copy or return
    ``x`` itself depends on ``x``'s strides."""
    if kwargs.get("memory_format") in _CHANNELS_LAST:
        raise UnsupportedOpError(
            f"{func_name(func)}(memory_format={kwargs['memory_format']}) of a per-instance "
            f"value at {user_site()}: inside batch_map a value is a row of a batched tensor "
            "laid out by batch_map; leave out memory_format (it changes no value)."
        )


_WEIGHTED_LOSSES = frozenset(["cross_entropy", "nll_loss"])


def refuse_weight_grad(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """A class ``weight`` that requires grad, in grad mode: eager PyTorch refuses it (its loss
    has no gradient for the weight), where a batched loss would make one."""
    if name not in _WEIGHTED_LOSSES or not torch.is_grad_enabled():
        return
    weight = kwargs.get("weight", args[2] if len(args) > 2 else None)
    if isinstance(weight, torch.Tensor) and weight.requires_grad:
        raise RuntimeError(
            f"{name} at {user_site()}: a class weight that requires grad, which eager PyTorch "
            "refuses (nll_loss is not differentiable with respect to its weight); pass "
            "weight.detach()"
        )


def refuse_write_after_sync(signatures: Any, func: Any, args: tuple[Any, ...]) -> None:
    """A write into a tensor from outside that recorded ops read, made after a sync point:
    the instances then record out of eager's order (a later instance's read may have run
    before an earlier instance's write, or the other way round), so a read of it may see
    the value eager code would not."""
    name = getattr(func, "__name__", "")
    in_place = (name[-1:] == "_" and name[:1] != "_") or name in ("__set__", "__setitem__")
    if not in_place or not args or not isinstance(args[0], torch.Tensor):
        return
    with torch._C.DisableTorchFunction():  # ._base is a getter: not for the recorder
        targets = {id(args[0]), id(args[0]._base)}
    if any(id(t) in targets for sig in signatures for t, _ in sig.shared):
        raise UnsupportedOpError(
            f"{func_name(func)} at {user_site()} writes in place into a tensor from outside "
            "batch_map that recorded ops read, after a sync point: the instances record out "
            "of eager's order from there, so some would read it as eager code would not. "
            "Change it outside the function given to batch_map, or before any value is read."
        )


_LEAF_COPIES = frozenset(["tensor", "asarray", "new_tensor"])


def refuse_leaf_copy(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """``torch.tensor(h, requires_grad=True)`` of a lazy ``h``: eagerly a new leaf; inside, a
    value is no leaf of its own (as for ``requires_grad_()``); it lost the flag."""
    lazy = any(type(a) is Lazy for a in args[:2])
    if name in _LEAF_COPIES and lazy and kwargs.get("requires_grad") is True:
        raise UnsupportedOpError(
            f"{name}(..., requires_grad=True) of a lazy tensor at "
            f"{user_site()}: {_ATTRIBUTES['requires_grad_']}."
        )
