"""What a PyTorch call means for recording: views, randomness, in-place forms, grad modes.

The recorder asks these questions of each call it sees. The answers keep recorded code
equal to eager code: a write into a tensor with live views is refused (eager PyTorch would
change the views too), a random call on shared tensors is never memoised (every call draws
anew), an op whose output shape depends on values is refused with the way to write it, and
every node runs under the grad mode it was recorded in.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ..errors import UnsupportedOpError
from ..signature import INHERITS_GRAD, NEEDS_GRAD, NO_GRAD

# Calls whose result may share memory with their first argument in eager PyTorch
# (a superset: an op listed here that copies only makes a later write refused, never wrong).
VIEW_NAMES = frozenset(
    [
        "__getitem__",
        "view",
        "view_as",
        "reshape",
        "reshape_as",
        "flatten",
        "unflatten",
        "ravel",
        "squeeze",
        "unsqueeze",
        "transpose",
        "t",
        "permute",
        "movedim",
        "moveaxis",
        "swapaxes",
        "swapdims",
        "narrow",
        "select",
        "expand",
        "expand_as",
        "broadcast_to",
        "unbind",
        "chunk",
        "split",
        "split_with_sizes",
        "tensor_split",
        "hsplit",
        "vsplit",
        "dsplit",
        "diagonal",
        "detach",
        "contiguous",
        "as_strided",
        "unfold",
        "real",
        "imag",
        "view_as_real",
        "view_as_complex",
        "to",
        "type",
        "type_as",
        "float",
        "double",
        "half",
        "bfloat16",
        "long",
        "int",
        "short",
        "bool",
        "char",
        "byte",
        "alias",
        "dropout",
        "alpha_dropout",
        "feature_alpha_dropout",
        # the input itself where nothing changes, as eager returns it
        "cpu",
        "cuda",
        "positive",
        "__pos__",
        "conj",
        "resolve_conj",
        "resolve_neg",
        "adjoint",
        "atleast_1d",
        "atleast_2d",
        "atleast_3d",
        "sum_to_size",
        "to_dense",
        "dropout1d",
        "dropout2d",
        "dropout3d",
        # views of every lazy argument (see VIEWS_OF_EVERY_ARGUMENT)
        "broadcast_tensors",
        "meshgrid",
        "einsum",
    ]
)

_RANDOM_STEMS = frozenset(
    [
        "normal",
        "log_normal",
        "bernoulli",
        "poisson",
        "multinomial",
        "uniform",
        "exponential",
        "cauchy",
        "geometric",
        "rrelu",
        "gumbel_softmax",
        "random",
        "randperm",
    ]
)


VIEWS_OF_EVERY_ARGUMENT = frozenset(
    ["broadcast_tensors", "meshgrid", "einsum", "atleast_1d", "atleast_2d", "atleast_3d"]
)
"""View ops whose outputs may view any of their lazy arguments, not only the first."""


def base_name(func: Any) -> str:
    """``func``'s ``__name__`` (``""`` when it has none)."""
    return getattr(func, "__name__", "") or ""


def is_random(func: Any) -> bool:
    """Whether a call draws random numbers, so that two calls must not share a result."""
    name = base_name(func)
    stem = name.rstrip("_")
    return "dropout" in name or stem in _RANDOM_STEMS or stem.startswith("rand")


def is_view(func: Any) -> bool:
    """Whether a call's result may be a view of its first argument."""
    return base_name(func) in VIEW_NAMES


def in_place_form(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The out-of-place function of an in-place call (``torch.relu_`` -> ``torch.relu``).

    Returns ``None`` for a call that is not in place, ``False`` for an in-place call with no
    out-of-place form.
    """
    name = base_name(func)
    if not name.endswith("_") or name.startswith("_"):
        return None
    stem = name[:-1]
    for space in (F, torch, torch.Tensor):
        if getattr(space, name, None) is func:
            return getattr(space, stem, None) or getattr(torch.Tensor, stem, None) or False
    return getattr(torch.Tensor, stem, None) or False


NO_CACHE = "_batchfold_no_cache"  # the attribute :func:`no_cache` sets on a module


def no_cache(module: torch.nn.Module) -> torch.nn.Module:
    """Record every call of ``module`` inside ``batch_map`` op by op (no cached trace).

    Returns the module, so it can wrap a constructor: ``head = bf.no_cache(nn.Linear(4, 2))``.
    """
    setattr(module, NO_CACHE, True)
    return module


def own_hooks(module: torch.nn.Module) -> bool:
    """Whether ``module`` itself has forward or backward hooks (or pre-hooks)."""
    return bool(
        module._forward_hooks
        or module._forward_pre_hooks
        or module._backward_hooks
        or module._backward_pre_hooks
    )


def run_context() -> tuple[Any, ...]:
    """What a recorded call's output dtypes depend on besides its key: the default dtype and
    autocast (kept traces and kept graphs serve only calls made under the same)."""
    return (
        torch.get_default_dtype(),
        torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu"),
        torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda"),
    )


# calls whose floating outputs never require grad in eager PyTorch, whatever their inputs
# (unless asked for with requires_grad=True)
_NO_GRADIENT = frozenset(
    [
        "detach",
        "histc",
        "zeros_like",
        "ones_like",
        "empty_like",
        "full_like",
        "rand_like",
        "randn_like",
        "randint_like",
        "new_zeros",
        "new_ones",
        "new_full",
        "new_empty",
        "new_tensor",
    ]
)
# calls that may hand back their input or a view of it, which outside grad mode keeps the
# input's flag (eagerly every other call's outputs then require no grad: a new tensor)
_MAY_ALIAS = VIEW_NAMES | {"T", "mT", "H", "mH", "adjoint", "indices", "values", "align_to"}

_SCRIPT_METHOD = torch._C.ScriptMethod


def grad_rule(func: Any, mode: int, shared: Any, requires_grad: bool = False) -> int:
    """When a recorded call's outputs require grad in eager PyTorch (a ``Signature.grad_rule``).

    ``mode`` is the grad mode of the call (:func:`grad_mode`), ``shared`` the tensors from
    outside among its arguments (with their versions), ``requires_grad`` its keyword of that
    name. In grad mode an output requires grad when an input does; one read from outside
    decides it for every node; so does a TorchScript module's method, which reads the module's
    weights without passing them. Outside grad mode a call known to make a new tensor gives one
    that requires none; any other may hand back its input (``h.cpu()``) and keeps its flag.
    """
    name = base_name(func)
    if name in _NO_GRADIENT and not requires_grad:
        return NO_GRAD
    if mode == 1 and (type(func) is _SCRIPT_METHOD or any(t.requires_grad for t, _ in shared)):
        return NEEDS_GRAD
    return NO_GRAD if mode != 1 and name not in _MAY_ALIAS else INHERITS_GRAD


def grad_mode() -> int:
    """The grad mode calls are recorded in: 0 no grad, 1 grad, 2 inference mode."""
    if torch.is_inference_mode_enabled():
        return 2
    return 1 if torch.is_grad_enabled() else 0


# ops whose output shape depends on the values of their inputs ------------------------------

_VALUE_SHAPED = {
    "nonzero": "torch.where(x != 0, x, 0) keeps the shape",
    "argwhere": "torch.where(x != 0, x, 0) keeps the shape",
    "unique": "sort the values (torch.sort) and compare neighbours, which keeps the shape",
    "unique_consecutive": "compare neighbours (x[1:] != x[:-1]), which keeps the shape",
    "masked_select": "torch.where(mask, x, 0) keeps the shape",
    "bincount": "F.one_hot(x, num_classes).sum(0) has a fixed length",
    # pack_sequence and pack_padded_sequence of one instance's sequences
    "_pack_padded_sequence": "batch_map batches sequences of any length already: call the "
    "recurrent layer on each sequence itself, unpadded",
}


def refuse_unrecordable(
    name: str,
    func: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    lazy_type: type,
    site: str,
) -> None:
    """Raise a clear error for a call that batch_map cannot record: its output shape would
    depend on per-instance values, it writes into a shared tensor on every call (an
    embedding with ``max_norm``), or its gradient depends on which lookups share the call
    (``scale_grad_by_freq``)."""
    if func is torch.autograd.grad or func is torch.autograd.backward:
        raise UnsupportedOpError(
            f"{name} at {site} on lazy tensors: gradients are computed after batch_map has "
            "run the batch; return the values from the function and call it on the results."
        )
    if base_name(func) in ("_make_dual", "_unpack_dual"):
        raise UnsupportedOpError(
            f"{name} at {site}: forward-mode AD inside batch_map; the batched ops run after the "
            "function has left its dual level. Take the derivative outside: torch.func.jvp of "
            "a function that calls batch_map."
        )
    if base_name(func) in ("embedding", "embedding_bag"):
        # F.embedding(input, weight, padding_idx, max_norm, norm_type, scale_grad_by_freq);
        # torch.embedding(weight, input, padding_idx, scale_grad_by_freq): no max_norm
        functional = func in (F.embedding, F.embedding_bag)
        at_weight, at_freq = (1, 5) if functional else (0, 3)
        max_norm = args[3] if functional and len(args) > 3 else kwargs.get("max_norm")
        if max_norm is not None:
            raise UnsupportedOpError(
                f"{name} at {site} with max_norm renormalises rows of its table, changed in "
                "place on every lookup; batch_map would run all lookups at once, so it cannot "
                "be recorded. Renormalise the table outside the function, or leave max_norm "
                "unset."
            )
        by_freq = args[at_freq] if len(args) > at_freq else kwargs.get("scale_grad_by_freq")
        weight = args[at_weight] if len(args) > at_weight else kwargs.get("weight")
        if by_freq and torch.is_grad_enabled() and getattr(weight, "requires_grad", False):
            raise UnsupportedOpError(
                f"{name} at {site} with scale_grad_by_freq divides each row's gradient by how "
                "often its index occurs in that call; batch_map runs the lookups of every "
                "instance as one call, so the counts (and the gradients) would be the batch's. "
                "Leave scale_grad_by_freq unset inside batch_map (in no_grad it has no effect)."
            )
    fix = _VALUE_SHAPED.get(base_name(func))
    if fix is None and base_name(func) == "repeat_interleave":
        # repeat_interleave(x, repeats), by keyword too; repeat_interleave(counts) alone
        repeats = args[1] if len(args) > 1 else kwargs.get("repeats", args[0] if args else None)
        if type(repeats) is lazy_type:
            fix = "repeat by a Python int, or read the counts first with .tolist()"
    if fix is None and base_name(func) == "tensor_split":
        names = ("indices", "sections", "tensor_indices_or_sections")
        split = args[1] if len(args) > 1 else next((kwargs[k] for k in names if k in kwargs), 0)
        if type(split) is lazy_type:
            fix = "split at Python ints (a list, or read the tensor first with .tolist())"
    if fix is None and base_name(func) == "where" and len(args) + len(kwargs) == 1:
        fix = "torch.where(cond, x, y) with three arguments keeps the shape"
    if fix is None and base_name(func) == "__getitem__" and len(args) == 2:
        index = args[1] if isinstance(args[1], tuple) else (args[1],)
        if any(type(i) is lazy_type and i.dtype in (torch.bool, torch.uint8) for i in index):
            fix = "torch.where(mask, x, 0) keeps the shape; or read the mask first: mask.tolist()"
    if fix is not None:
        raise UnsupportedOpError(
            f"{name} at {site}: its output shape depends on per-instance values, which "
            "batch_map computes later for all instances together, so it cannot be recorded.\n"
            f"    right: {fix}\n"
            "    or: read the values first (a sync point), e.g. with .tolist(), and index with "
            "Python numbers."
        )


# code objects: keys and module state hold them by identity (call_keys.py, kept.py)
CODE_TYPES = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, type)

# calls that only ask about a value's dtype, rank or size (nn.MultiheadAttention asks
# torch.is_floating_point(mask)): answered from the lazy value's shape and dtype at once
META_QUERIES: dict[Any, Callable[[Any], Any]] = {
    torch.is_floating_point: lambda x: x.dtype.is_floating_point,
    torch.Tensor.is_floating_point: lambda x: x.dtype.is_floating_point,
    torch.is_complex: lambda x: x.dtype.is_complex,
    torch.Tensor.is_complex: lambda x: x.dtype.is_complex,
    torch.is_signed: lambda x: x.dtype.is_signed,
    torch.Tensor.is_signed: lambda x: x.dtype.is_signed,
    torch.Tensor.ndimension: lambda x: x.dim(),
    torch.Tensor.nelement: lambda x: x.numel(),
    torch.numel: lambda x: x.numel(),
    torch.Tensor.element_size: lambda x: x.dtype.itemsize,
    torch.Tensor.get_device: lambda x: -1 if x.device.type == "cpu" else x.device.index,
}

# Tensor attributes the lazy tensor does not record as calls (object protocol, reads,
# autograd, memory; see lazy/tensor.py)
NOT_RECORDED = frozenset(
    """
    __init__ __new__ __class__ __getattribute__ __setattr__ __delattr__ __repr__ __str__
    __format__ __hash__ __reduce__ __reduce_ex__ __setstate__ __getstate__ __dir__
    __sizeof__ __init_subclass__ __subclasshook__ __torch_function__ __torch_dispatch__
    __deepcopy__ __array__ __array_wrap__ __array_priority__ __dlpack__ __dlpack_device__
    __contains__ __iter__ __len__ __bool__ __int__ __float__ __index__ __complex__ __long__
    __nonzero__ __setitem__ __delitem__ __reversed__ __cuda_array_interface__ __weakref__
    __module__ __doc__ __slots__ backward register_hook retain_grad data_ptr storage
    untyped_storage
    """.split()  # noqa: SIM905
)

# x op= y is x.op_(y) in eager PyTorch: the same object changes
AUGMENTED = {
    "__iadd__": "add",
    "__isub__": "sub",
    "__imul__": "mul",
    "__itruediv__": "div",
    "__ifloordiv__": "floor_divide",
    "__imod__": "remainder",
    "__ipow__": "pow",
    "__iand__": "bitwise_and",
    "__ior__": "bitwise_or",
    "__ixor__": "bitwise_xor",
    "__ilshift__": "bitwise_left_shift",
    "__irshift__": "bitwise_right_shift",
}
