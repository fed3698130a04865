"""``bf.function``: a cell or layer recorded as one node per call inside ``batch_map``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves, tree_map

from ..errors import ShapeError, UnsupportedOpError
from ..graph import Signature
from ..ops import OpRule, fill
from .context import active_recorder
from .lazy_trees import has_lazy
from .module_state import SET_AT
from .sites import version

Tensor = torch.Tensor


class BatchedFunction:
    """A function recorded as one node per call inside ``batch_map`` (see :func:`function`)."""

    def __init__(self, fn: Callable[..., Any], batched: bool) -> None:
        self.fn = fn
        self.batched = batched
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)
        rule = self._batched_call if batched else self._vmapped_call
        self.rule = OpRule(self.__name__, rule, loops=not batched)  # vmap fails: once each
        self.rows_checked: set[Any] = set()  # the kinds of call (_call_kind) found row-wise

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        rec = active_recorder()
        if rec is not None and has_lazy(args, kwargs):
            return rec.call(self, args, kwargs)
        return self.eager(*args, **kwargs)

    def eager(self, *args: Any, **kwargs: Any) -> Any:
        """Call the function on one instance's real tensors."""
        if not self.batched:
            return self.fn(*args, **kwargs)
        out = self.fn(*tree_map(_unsqueeze, args), **tree_map(_unsqueeze, kwargs))
        with torch.enable_grad():  # recorded where the output has a history, as fn made it
            return tree_map(lambda t: t.squeeze(0) if isinstance(t, Tensor) else t, out)

    def eager_for_shapes(self, shared: list[bool]) -> Callable[..., Any]:
        """:meth:`eager`, as shape inference runs it once on zeros at a new signature, noting
        in ``shared`` whether an output shares memory with an argument or with another output
        (``x`` itself, a view of it, ``t`` twice): eagerly a write into one is seen through the
        other."""

        def run(*args: Any, **kwargs: Any) -> Any:
            with self.probing():
                return probe(*args, **kwargs)

        def probe(*args: Any, **kwargs: Any) -> Any:
            with torch._C.DisableTorchFunction():
                tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, Tensor)]
                versions = [version(t) for t in tensors]
            out = self.eager(*args, **kwargs)
            with torch._C.DisableTorchFunction():
                if [version(t) for t in tensors] != versions:
                    raise UnsupportedOpError(
                        f"{self!r} writes into its arguments in place; inside batch_map its "
                        "call runs later, batched, so the write would reach other instances' "
                        "values or none. Make the function pure: compute and return new "
                        "tensors (h * 2, not h.mul_(2))."
                    )
                seen = {
                    t.untyped_storage().data_ptr()
                    for t in tree_leaves((args, kwargs))
                    if isinstance(t, Tensor) and t.numel()
                }
                found = False
                for o in tree_leaves(out):
                    if isinstance(o, Tensor) and o.numel():
                        memory = o.untyped_storage().data_ptr()
                        found = found or memory in seen
                        seen.add(memory)
                if self.batched and (key := _call_kind(args, kwargs)) not in self.rows_checked:
                    self._check_rows(args, kwargs, out)  # once per kind of call: the probes
                    self._check_row_values(args, kwargs)  # run again at each new signature
                    self.rows_checked.add(key)
            shared.append(found)
            return out

        return run

    def _check_rows(self, args: tuple[Any, ...], kwargs: dict[str, Any], one: Any) -> None:
        """Refuse a ``batched=True`` function whose outputs on a batch of 2 or 3 rows (copies
        of this call's inputs) are not a row each: it does not treat dim 0 as the batch (``a *
        s`` with ``s`` a per-instance 0-d value, which arrives as ``[n]``), and its batched
        step would fail, or broadcast silently where ``n`` equals a row's width."""
        want = [(tuple(t.shape), t.dtype) for t in tree_leaves(one) if isinstance(t, Tensor)]
        for n in (2, 3):

            def rows(x: Any, n: int = n) -> Any:
                return x.unsqueeze(0).repeat(n, *([1] * x.dim())) if isinstance(x, Tensor) else x

            try:
                out = self.fn(*tree_map(rows, args), **tree_map(rows, kwargs))
                got = [(tuple(t.shape), t.dtype) for t in tree_leaves(out) if isinstance(t, Tensor)]
            except Exception as error:  # noqa: BLE001 - the user's code on a batch: named below
                got = [f"{type(error).__name__}: {error}"]
            if got != [((n, *shape), dtype) for shape, dtype in want]:
                raise ShapeError(
                    f"{self!r} takes a batch, but on {n} rows it gives {got}, not one row "
                    f"each of {want}: it must treat dim 0 as the batch everywhere (a "
                    "per-instance 0-d value arrives as [n]: broadcast it with s[:, None])."
                )

    @contextmanager
    def probing(self) -> Iterator[None]:
        """Around the calls on made-up values that learn the function's outputs: the random
        generators' states and the buffers of the modules it reaches are as before them (a
        dropout inside drew, and a normalisation moved its running statistics, as no eager
        call does)."""
        modules, _ = self.reached()
        with torch._C.DisableTorchFunction():
            kept = [(b, b.detach().clone()) for m in modules for b in m.buffers(recurse=False)]
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        # the generators' own methods: torch.set_rng_state is refused inside batch_map
        cpu_state = torch.default_generator.get_state()
        cuda_states = torch.cuda.get_rng_state_all() if cuda else []
        try:
            yield
        finally:
            torch.default_generator.set_state(cpu_state)
            if cuda:
                torch.cuda.set_rng_state_all(cuda_states)
            with torch._C.DisableTorchFunction(), torch.no_grad():
                for buffer, value in kept:
                    buffer.data.copy_(value)  # without a version bump: nothing was written

    def _check_row_values(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Refuse a ``batched=True`` function whose output rows depend on each other (a
        softmax or a cumulative sum over dim 0, a normalisation over the batch): on three
        different rows (these inputs plus 0, 2, 1; integers too), each output row must be the function's
        output on that row alone. Inconclusive where the made-up rows raise."""

        def row(k: int) -> Any:  # rows out of order (+0, +2, +1): a sort over dim 0 moves them
            shift = (0, 2, 1)[k]
            return lambda x: x + shift if isinstance(x, Tensor) and x.dtype != torch.bool else x

        def rows(x: Any) -> Any:
            return torch.stack([row(k)(x) for k in range(3)]) if isinstance(x, Tensor) else x

        try:
            alone = [
                tree_leaves(self.eager(*tree_map(row(k), args), **tree_map(row(k), kwargs)))
                for k in range(3)
            ]
            before = _generator_states()
            together = tree_leaves(self.fn(*tree_map(rows, args), **tree_map(rows, kwargs)))
        except Exception:  # noqa: BLE001 - made-up values the function may not take
            return
        if not all(torch.equal(a, b) for a, b in zip(before, _generator_states(), strict=True)):
            return  # it draws random numbers: its rows cannot be compared
        for k, outs in enumerate(alone):
            for one, many in zip(outs, together, strict=False):
                if isinstance(one, Tensor) and not _close(one, many[k]):
                    raise ShapeError(
                        f"{self!r} takes a batch, but its output for one row depends on the "
                        "other rows of the batch (an op over dim 0: a softmax, a sum or a "
                        "normalisation over the batch); batched, each instance would see the "
                        "others. Make it treat each row on its own, or use batched=False."
                    )

    def output_grad(
        self, template: tuple[Any, Any], in_metas: tuple[Any, ...], grad: bool
    ) -> tuple[tuple[bool, tuple[int, ...]], ...]:
        """Per output of a call (``template`` and ``in_metas`` its signature's, ``grad`` its
        grad mode), when eager PyTorch gives it ``requires_grad``: ``(needs, reads)`` (see
        ``Signature.set_output_grad``). Found by calling the function on zeros and on ones
        (a function that branches on its values may take another way on each; an output
        requires grad where either says so): once with no input requiring grad (an output that
        still does reads a weight), then once for each floating-point input requiring it."""
        args, kwargs = template

        def on(make: Any, grad_at: int | None) -> list[bool]:
            with torch._C.DisableTorchFunction(), torch.set_grad_enabled(grad):
                values = [
                    make(m.shape, dtype=m.dtype, device=m.device, requires_grad=i == grad_at)
                    for i, m in enumerate(in_metas)
                ]
                out = self.eager(*fill(args, values), **fill(kwargs, values))
                return [t.requires_grad for t in tree_leaves(out) if isinstance(t, Tensor)]

        def flags(grad_at: int | None) -> list[bool]:
            found = on(torch.zeros, grad_at)
            try:  # ones may not suit the function (an index out of range): zeros then decide
                return [a or b for a, b in zip(found, on(torch.ones, grad_at), strict=True)]
            except Exception:
                return found

        with self.probing():  # once around every call below, not per call
            return self._output_grad(flags, in_metas)

    def _output_grad(
        self, flags: Callable[[int | None], list[bool]], in_metas: tuple[Any, ...]
    ) -> tuple[tuple[bool, tuple[int, ...]], ...]:
        needs = flags(None)
        reads: list[list[int]] = [[] for _ in needs]
        for i, meta in enumerate(in_metas):
            if meta.dtype.is_floating_point or meta.dtype.is_complex:
                for j, flag in enumerate(flags(i)):
                    if flag and not needs[j]:
                        reads[j].append(i)
        return tuple((n, tuple(r)) for n, r in zip(needs, reads, strict=True))

    def reached(self) -> tuple[list[nn.Module], list[Tensor]]:
        """The modules and tensors the function reaches without its arguments: itself or the
        module of a bound method, and what its closure holds. Its batched call runs with them
        as they are when the batch runs, so their changes between calls inside one
        ``batch_map`` are refused (see :func:`refuse_changed`)."""
        fn = self.fn
        held = [fn, getattr(fn, "__self__", None)]
        held += [cell.cell_contents for cell in getattr(fn, "__closure__", None) or ()]
        modules = [m for h in held if isinstance(h, nn.Module) for m in h.modules()]
        tensors = [t for t in held if isinstance(t, Tensor)]
        tensors += [t for m in modules for t in (*m._parameters.values(), *m._buffers.values())]
        return modules, [t for t in tensors if t is not None]

    def _batched_call(self, sig: Signature, inputs: list[Tensor], n: int) -> Any:
        args, kwargs = sig.template
        return self.fn(*fill(args, inputs), **fill(kwargs, inputs))

    def _vmapped_call(self, sig: Signature, inputs: list[Tensor], n: int) -> Any:
        args, kwargs = sig.template
        return torch.func.vmap(
            lambda *xs: self.fn(*fill(args, xs), **fill(kwargs, xs)), randomness="different"
        )(*inputs)

    def __repr__(self) -> str:
        return f"function({self.__name__}, batched={self.batched})"


def _unsqueeze(x: Any) -> Any:
    return x.unsqueeze(0) if isinstance(x, Tensor) else x


def _call_kind(args: Any, kwargs: Any) -> Any:
    """A call's tensors' shapes and dtypes and its other arguments' types."""
    return tuple(
        (tuple(x.shape), x.dtype) if isinstance(x, Tensor) else type(x)
        for x in tree_leaves((args, kwargs))
    )


def _close(one: Tensor, row: Tensor) -> bool:
    """Whether a row of a batched output is the one-row output, to the rounding in which a
    batched kernel may differ from a one-row one (a few units in the last place of its
    dtype: a bfloat16 GRU's batched and one-row outputs differ by one)."""
    if one.shape != row.shape:
        return False
    if not (one.is_floating_point() or one.is_complex()):
        return bool(torch.equal(one, row))
    tol = max(1e-3, 16 * torch.finfo(one.dtype).eps)
    return bool(torch.allclose(one.double(), row.double(), rtol=tol, atol=tol, equal_nan=True))


def _generator_states() -> list[Tensor]:
    """The default generators' states (the CPU's, and each CUDA device's once initialised)."""
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    return [torch.default_generator.get_state(), *(torch.cuda.get_rng_state_all() if cuda else [])]


def function(fn: Callable[..., Any] | None = None, *, batched: bool = False) -> Any:
    """Record each call of ``fn`` inside ``batch_map`` as one node instead of one per op.

    Use it on a cell or layer that is a pure function of its tensor arguments: recording gets
    cheaper and the batched step runs ``fn`` once. With ``batched=False``, ``fn`` is written
    for one instance and is batched with ``torch.func.vmap``; with ``batched=True``, ``fn``
    already takes a leading batch dimension (like an ``nn.Linear``) and is called on the batch.
    Outside ``batch_map`` the wrapper calls ``fn`` as usual.

    Arguments:
        fn: the function or ``nn.Module`` to wrap (or leave out to use as a decorator).
        batched: whether ``fn`` accepts a leading batch dimension.

    Returns:
        The wrapped callable.

    Example:
        >>> import torch, batchfold as bf
        >>> cell = bf.function(torch.nn.Linear(3, 2), batched=True)
        >>> out = bf.batch_map(lambda v: cell(torch.tensor(v)), [[1.0, 2.0, 3.0]] * 4)
        >>> len(out), tuple(out[0].shape)
        (4, (2,))
    """
    if fn is None:
        return lambda f: BatchedFunction(f, batched)
    return BatchedFunction(fn, batched)


def refuse_changed(calls: list[tuple[Signature, list[nn.Module], int]], graph: Any) -> None:
    """Refuse to run the pending calls of ``bf.function`` (each: its signature, the modules
    it reaches, the count of module attribute sets when it was made or its last calls ran)
    whose modules had an attribute set since: each would see the module as it is when the
    batch runs."""
    for sig, modules, epoch in calls:
        if not graph.pending_of[sig.pool].nodes:
            continue
        changed = next((m for m in modules if SET_AT.get(id(m), 0) > epoch), None)
        if changed is not None:
            raise UnsupportedOpError(
                f"an attribute of {type(changed).__name__}, which {sig.name} at {sig.site} "
                "(a bf.function) calls, was set between its calls inside batch_map: its "
                "batched call runs once, with the module as it is when the batch runs, where "
                "eagerly each call sees it as it was then. Set it outside the function given "
                "to batch_map."
            )
