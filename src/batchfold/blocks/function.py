"""``Function``: a batched callable or ``nn.Module`` as a block, one graph node per call.

At run time the node's batch runs as one call of the function on the stacked inputs (batch
dimension first). With ``per_instance=True`` the function is code for one instance, recorded
op by op through the lazy front end into the same graph.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils._pytree import tree_leaves

from ..errors import UnsupportedOpError
from ..graph import Signature, TensorMeta
from ..lazy import Lazy
from ..ops import OpRule, fill
from .base import Block
from .codegen import Emitter, Symbol, flat_ids, structured
from .convert import register_converter
from .types import (
    BlockTypeError,
    TensorType,
    TupleType,
    Type,
    flat_tensor_types,
    is_tensors,
    short,
)
from .walker import OpSpec, Specializer, Tape, Walker, tensor_template


def modules_of(fn: Any) -> list[nn.Module]:
    """The modules whose parameters a callable uses: itself, or the module of a bound method."""
    if isinstance(fn, nn.Module):
        return [fn]
    owner = getattr(fn, "__self__", None)
    return [owner] if isinstance(owner, nn.Module) else []


def device_of(modules: list[nn.Module]) -> torch.device:
    """Where the first parameter (or buffer) of ``modules`` lives; CPU when they have none."""
    for module in modules:
        for tensor in module.parameters():
            return tensor.device
        for tensor in module.buffers():
            return tensor.device
    return torch.device("cpu")


def _type_of(out: Any, batch: int | None) -> Type:
    """The per-instance type of a function's output (``batch`` rows, or none if ``None``)."""
    if isinstance(out, (tuple, list)) and out:
        return TupleType(*(_type_of(item, batch) for item in out))
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"it returned {short(out, 60)}, not a tensor or a tuple of tensors")
    if batch is None:
        return TensorType(tuple(out.shape), out.dtype)
    if out.dim() == 0 or out.shape[0] != batch:
        raise TypeError(f"it returned shape {tuple(out.shape)} for a batch of {batch}")
    return TensorType(tuple(out.shape[1:]), out.dtype)


def _call_args(in_type: Type) -> Any:
    """The positional arguments of a call on ``in_type``: one per tuple item, a ``Slot`` each."""
    template = tensor_template(in_type, [0])
    return (template,) if isinstance(in_type, TensorType) else template


class Function(Block):
    """A batched callable or ``nn.Module`` as a block: one node per call, run on whole batches.

    ``fn`` takes a batch (dimension 0) of each input tensor: a tensor input is one argument,
    a tuple input is one argument per item. The output type is found by calling ``fn`` once on
    a batch of zeros (in eval mode, without gradients) unless ``out_type`` is given. Any
    ``nn.Module`` becomes a block this way, and its weights are shared wherever it is used.

    Arguments:
        fn: the batched callable or module.
        in_type: the input type it needs, when fixed (checked at composition).
        out_type: its output type, to skip the trial call.
        name: the name shown in plans and errors.
        per_instance: ``fn`` is code for one instance (no batch dimension), recorded op by op
            as in ``batch_map``.
        modules: modules a plain function uses, so the compiled model registers them.

    Example:
        >>> from batchfold.blocks import Vector
        >>> lin = torch.nn.Linear(2, 3)
        >>> out = (Vector(2) >> Function(lin)).eval([1.0, 2.0])
        >>> torch.allclose(out, lin(torch.tensor([1.0, 2.0])))
        True
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        in_type: Type | None = None,
        out_type: Type | None = None,
        name: str | None = None,
        per_instance: bool = False,
        modules: Sequence[nn.Module] = (),
    ) -> None:
        if not callable(fn):
            raise TypeError(f"Function needs a callable, got {short(fn)}")
        self.fn, self.in_type, self.declared_out = fn, in_type, out_type
        self.name = name or getattr(fn, "__name__", None) or type(fn).__name__
        self.per_instance = per_instance
        self.modules = modules_of(fn) + [m for m in modules if m not in modules_of(fn)]
        self._out_types: dict[Type, Type] = {}

    def _specialize(self, in_type: Type, ctx: Specializer, path: str) -> Walker:
        if not is_tensors(in_type):
            raise BlockTypeError(self, path, "a tensor or a tuple of tensors", in_type)
        if self.in_type is not None and in_type != self.in_type:
            raise BlockTypeError(self, path, repr(self.in_type), in_type)
        out = self._out_type(in_type, path)
        for module in self.modules:
            ctx.module(module)
        args = _call_args(in_type)
        ins, outs = flat_tensor_types(in_type), flat_tensor_types(out)
        if self.per_instance:
            return Walker(out, _per_instance_walk(self.fn, args, ins, outs, out, self, path))
        multi = isinstance(out, TupleType)
        fn = self.fn
        norms = [m for m in self.modules for m in m.modules() if isinstance(m, _BatchNorm)]

        def batch_statistics(module: nn.Module, _: Any) -> None:  # a BatchNorm that runs
            if module.training or not getattr(module, "track_running_stats", True):
                raise UnsupportedOpError(
                    f"{self!r} at {path} runs a BatchNorm layer on statistics of its batch "
                    "(in training mode, or without running statistics): it normalises over "
                    "the rows batched into one step, other instances' included, so each "
                    "instance's result would depend on the batch. Use LayerNorm, or put the "
                    "model in eval mode."
                )

        def batched(sig: Signature, inputs: list[torch.Tensor], n: int) -> Any:
            versions = [x._version for x in inputs]
            hooks = [m.register_forward_pre_hook(batch_statistics) for m in norms]
            try:
                result = fn(*fill(args, inputs))
            finally:
                for hook in hooks:
                    hook.remove()
            if any(x._version != v for x, v in zip(inputs, versions, strict=True)):
                raise UnsupportedOpError(
                    f"{self!r} at {path} writes into its inputs in place; its inputs are rows "
                    "of steps other blocks read too, so the write would reach them in the "
                    "order steps run. Compute and return new tensors (x * 2, not x.mul_(2))."
                )
            return tuple(tree_leaves(result)) if multi else result

        rule = OpRule(self.name, batched, user=True)
        spec = ctx.spec(
            OpSpec(self.name, path, tuple(ins), tuple(outs), rule, fn, (args, {}), multi),
            share=("function", _identity(fn), in_type, out),
        )
        return call_walker(spec, in_type, out)

    def _out_type(self, in_type: Type, path: str) -> Type:
        if self.declared_out is not None:
            return self.declared_out
        out = self._out_types.get(in_type)
        if out is None:
            out = self._out_types[in_type] = self._trial(in_type, path)
        return out

    def _trial(self, in_type: Type, path: str) -> Type:
        """Call ``fn`` on zeros of ``in_type`` to learn its output type; a batched ``fn`` on
        batches of 2 and of 3, which must give one row each of the same type: code that does
        not treat dim 0 as the batch (``a * s`` with ``s`` a per-instance 0-d value, which
        arrives as ``[n]``) broadcasts silently where ``n`` equals a row's width."""
        if self.per_instance:
            return self._trial_at(in_type, path, None)
        found = self._trial_at(in_type, path, 2)
        self._trial_at(in_type, path, 3, found)  # raises where a batch of 3 gives another type
        return found

    def _trial_at(
        self, in_type: Type, path: str, batch: int | None, want: Type | None = None
    ) -> Type:
        device = device_of(self.modules)
        lead = () if batch is None else (batch,)
        zeros = [
            torch.zeros((*lead, *t.shape), dtype=t.dtype, device=device)
            for t in flat_tensor_types(in_type)
        ]
        args = _call_args(in_type)
        try:
            with ExitStack() as stack:
                stack.enter_context(torch._C.DisableTorchFunction())
                stack.enter_context(torch.no_grad())
                # dropout drawn here would move the generator: a run resumed from a checkpoint
                # would draw other masks than one that compiled its blocks once
                stack.enter_context(torch.random.fork_rng(devices=_rng_devices()))
                training = [(m, m.training) for m in self.modules]
                stack.callback(lambda: [m.train(mode) for m, mode in training])
                for module in self.modules:
                    module.eval()
                found = _type_of(self.fn(*fill(args, zeros)), batch)
                if want is not None and found != want:
                    raise TypeError(
                        f"on a batch of 2 it gives one row each of {want!r}, on a batch of 3 "
                        f"{found!r}"
                    )
                return found
        except Exception as error:
            raise BlockTypeError(
                self,
                path,
                "an input it can compute on",
                in_type,
                hint=f"Calling it on zeros of that type raised {type(error).__name__}: {error}"
                + (_ROWS_HINT if want is not None else ""),
            ) from error

    def __repr__(self) -> str:
        extra = ", per_instance=True" if self.per_instance else ""
        if self.in_type is not None:
            extra = f", in_type={self.in_type!r}" + extra
        return f"Function({_callable_repr(self.fn)}{extra})"


_ROWS_HINT = (
    " (a batch of 3; a batch of 2 ran): a batched function must treat dim 0 as the batch "
    "everywhere; a per-instance 0-d value arrives as [n]: broadcast it with s[:, None]"
)


def _identity(fn: Any) -> Any:
    """What makes two blocks' callables the same op: the object itself, never equality (two
    callables may compare equal and compute differently, or not be hashable); a bound method
    by its object and function, as each attribute access makes a new one."""
    if inspect.ismethod(fn):
        return ("method", id(fn.__self__), id(fn.__func__))
    return id(fn)


def _callable_repr(fn: Any) -> str:
    if isinstance(fn, nn.Module):
        inner = fn.extra_repr()
        return f"{type(fn).__name__}({inner})" if "\n" not in inner else f"{type(fn).__name__}(...)"
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if name is None:
        return short(fn, 40)
    module = getattr(fn, "__module__", None) or ""
    if module == "torch" or module.startswith("torch."):
        return f"{module}.{getattr(fn, '__name__', name)}"
    return name.rsplit("<locals>.", 1)[-1]


def _structure(t: Type, flat: list[int], start: int) -> tuple[Any, int]:
    """Rebuild the nested tuple of value ids of type ``t`` from a flat list."""
    if isinstance(t, TensorType):
        return flat[start], start + 1
    assert isinstance(t, TupleType)
    items = []
    for item in t.items:
        value, start = _structure(item, flat, start)
        items.append(value)
    return tuple(items), start


def flatten_values(x: Any) -> list[int]:
    """The value ids of a tensor (tuple) value, depth first."""
    if type(x) is tuple:
        return [v for item in x for v in flatten_values(item)]
    return [x]


def call_walker(spec: OpSpec, in_type: Type, out: Type) -> Walker:
    """The walker of a function node: flatten the input ids, add the node, shape the output."""

    def emit(em: Emitter, x: Symbol) -> Symbol:
        first = em.assign(
            f"tape.add({em.const(spec, 's')}, {em.expr(tuple(flat_ids(em, x, in_type)))})"
        )
        ids = [first] + [f"({first} + {i})" for i in range(1, len(flat_tensor_types(out)))]
        return structured(out, iter(ids))

    flat_in = isinstance(in_type, TupleType) and all(
        isinstance(i, TensorType) for i in in_type.items
    )
    if isinstance(out, TensorType):
        if isinstance(in_type, TensorType):
            return Walker(out, lambda tape, x: tape.add(spec, (x,)), emit)
        if flat_in:
            return Walker(out, lambda tape, x: tape.add(spec, x), emit)
        return Walker(out, lambda tape, x: tape.add(spec, flatten_values(x)), emit)
    count = len(flat_tensor_types(out))
    flat_out = all(isinstance(item, TensorType) for item in out.items)  # type: ignore[union-attr]

    def walk(tape: Tape, x: Any) -> Any:
        ids = (x,) if type(x) is int else x if flat_in else flatten_values(x)
        first = tape.add(spec, ids)
        if flat_out:
            return tuple(range(first, first + count))
        return _structure(out, list(range(first, first + count)), 0)[0]

    return Walker(out, walk, emit)


def _per_instance_walk(
    fn: Callable[..., Any],
    args: Any,
    ins: list[TensorType],
    outs: list[TensorType],
    out: Type,
    block: Block,
    path: str,
) -> Callable[[Tape, Any], Any]:
    """Record per-instance lazy code through a recorder that shares the tape's graph."""

    def walk(tape: Tape, x: Any) -> Any:
        rec = tape.lazy_recorder()
        rec.instance = tape.instance
        device = tape.device
        lazies = [
            Lazy(rec, v, TensorMeta.of(t.shape, t.dtype, device))
            for v, t in zip(flatten_values(x), ins, strict=True)
        ]
        if tape.lazy:
            result = fn(*fill(args, lazies))
        else:
            with rec:
                result = fn(*fill(args, lazies))
        ids = []
        for value, t in zip(tree_leaves(result), outs, strict=True):
            if type(value) is not Lazy or value._rec is not rec:
                raise tape.fail(
                    block, path, f"returned {short(value, 60)}, not a value computed from its input"
                )
            if value._meta.shape != t.shape or value._meta.dtype != t.dtype:
                raise tape.fail(block, path, f"returned a {value._meta}, expected {t!r}")
            ids.append(value._vid)
        return _structure(out, ids, 0)[0]

    return walk


@register_converter(nn.Module)
def _module_block(module: nn.Module) -> Function:
    return Function(module, in_type=getattr(module, "block_in_type", None))


__all__ = [
    "Function",
    "device_of",
    "flatten_values",
    "modules_of",
]


def _rng_devices() -> list[int]:
    """The CUDA devices whose generators a trial call may move (none before CUDA is used)."""
    return list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
