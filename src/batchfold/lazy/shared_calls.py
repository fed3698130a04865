"""Calls on tensors from outside ``batch_map`` (shared tensors), run at once and memoised.

``W.t()`` called by every instance must be the same tensor each time, or the nodes that read
it would get different signatures and never batch; so a call with no lazy argument runs once
per key (the function, its arguments, each tensor's version) and later calls get the same
result. Eagerly each call makes a tensor of its own, which the memo cannot give where the
result is written in place: a write into a result (or into a view of one) handed to one call
takes it out of the memo, so that later calls compute their own, and a write into a result
handed to several calls, which eagerly would change only one of them, is refused. Writes by
method (``p.mul_(2)``, ``p[i] = v``) come here through :meth:`SharedCalls.call`, writes by
keyword (``F.relu(p, inplace=True)``, ``out=p``) through the recorder's ``_in_place_keyword``.
A memoised result returned by several instances is made each one's own when results go back
(:meth:`SharedCalls.own`). Changes eager PyTorch makes without a version bump (``p.data = x``,
writes through ``p.data``, ``requires_grad``) are counted as writes here, and the tensors a
memoised result was made from are kept, so that stale reads are refused (:func:`refuse_stale`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from ..errors import UnsupportedOpError
from ..graph import Graph
from .context import dry, stop_dry
from .lazy_trees import map_lazies
from .refusals import refuse_hidden
from .semantics import is_random
from .sites import func_name, user_site, version

Tensor = torch.Tensor
_DATA = torch._C.TensorBase.__dict__["data"]  # the getset descriptor of ``t.data``
_REQUIRES_GRAD = torch._C.TensorBase.__dict__["requires_grad"]
_HOOKS = frozenset(["register_hook", "retain_grad", "register_post_accumulate_grad_hook"])
# where a backward call takes retain_graph among its positional arguments
_RETAIN_AT = {torch.Tensor.backward: 2, torch.autograd.grad: 3, torch.autograd.backward: 2}
READ = "read"
WRITES = "makes a random or in-place call on shared tensors"
UNHASHABLE = "calls a function on shared tensors with unhashable arguments"


class SharedCalls:
    """The memo of one recorder's calls on shared tensors."""

    def __init__(self) -> None:
        self.memo: dict[Any, tuple[Any, ...]] = {}
        # id of a memoised result -> (its key, how many calls it was handed to)
        self.handed: dict[int, tuple[Any, int]] = {}
        # id of a memoised result -> the tensors it was computed from, with their versions
        self.made_from: dict[int, tuple[tuple[Tensor, int], ...]] = {}

    def call(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], key: Any) -> Any:
        """Run ``func`` on shared tensors, or hand back its memoised result.

        Returns the result and what a module call traced around it must know: why it
        cannot be cached, :data:`READ` (it read a value into Python) or ``""``.
        """
        name = getattr(func, "__name__", "")
        owner = getattr(func, "__self__", None)
        if owner is _DATA:  # t.data, t.data = x: see _set_data
            if name != "__get__":
                if dry():
                    stop_dry("t.data = x")
                return self._set_data(func, args)
            func, args, kwargs = torch.Tensor.detach, args[:1], {}  # memoised as any call
        if name in _HOOKS and args and id(args[0]) in self.handed:
            key, count = self.handed[id(args[0])]
            if count == 1:  # one call's so far: later calls make their own, as eagerly
                self.memo.pop(key, None)
                return refuse_hidden(func, args, kwargs)(*args, **kwargs), READ
            raise UnsupportedOpError(
                f"{name}() at {user_site()} on a tensor computed from shared tensors only "
                "(W * 2): batch_map computes such a value once for all instances, so a hook on it would "
                "see every instance's gradient at once. Register it on a per-instance value, "
                "or compute the value before batch_map."
            )
        at = next((i for f, i in _RETAIN_AT.items() if f is func), None)  # any func: by identity
        if at is not None:  # eagerly each instance has its own graph; memoised, it is shared
            if len(args) > at:
                args = (*args[:at], True, *args[at + 1 :])
            else:
                kwargs = {**kwargs, "retain_graph": True}
        in_place = (name[-1:] == "_" and name[:1] != "_") or name in ("__set__", "__setitem__")
        if in_place or is_random(func):
            if dry():  # a write or a draw that could not be undone
                stop_dry(f"{name}()")
            target = args[0] if in_place and args and isinstance(args[0], Tensor) else None
            if target is not None:
                self.written(target, func)
            grad_set = target is not None and (name == "requires_grad_" or owner is _REQUIRES_GRAD)
            needs = grad_set and _requires_grad(target)
            result = refuse_hidden(func, args, kwargs)(*args, **kwargs)
            if target is not None and grad_set and _requires_grad(target) != needs:
                _bump(target)  # p.requires_grad_(False): the ops recorded before would run
            return result, WRITES  # without p's gradient
        try:
            hit = self.memo.get(key)
        except TypeError:  # an unhashable constant among the arguments
            return refuse_hidden(func, args, kwargs)(*args, **kwargs), UNHASHABLE
        if hit is None:
            result = refuse_hidden(func, args, kwargs)(*args, **kwargs)
            if not isinstance(result, Tensor):  # w.tolist(), w.dim(): a value read into Python
                return result, READ
            self.memo[key] = (result, args, kwargs)  # the inputs stay alive: ids stay
            self.handed[id(result)] = (key, 1)
            self._note_sources(result, args, kwargs)
            return result, ""
        result = hit[0]
        key_of, count = self.handed[id(result)]
        self.handed[id(result)] = (key_of, count + 1)
        return result, ""

    def _note_sources(self, result: Tensor, args: Any, kwargs: Any) -> None:
        with torch._C.DisableTorchFunction():  # versions are getters: not for the recorder
            inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, Tensor)]
            made = self.made_from
            pairs = [(t, version(t)) for t in inputs]
            self.made_from[id(result)] = (*pairs, *(p for t in inputs for p in made.get(id(t), ())))

    def computed(self) -> bool:
        """Whether a memoised result is a new tensor (``W * 2``), not a view of what it was
        made from (``W.t()``): its values are those of the tensors when it was made."""
        return not all(
            _views_inputs(result, args, kwargs) for result, args, kwargs in self.memo.values()
        )

    def handed_twice(self) -> set[int]:
        """The ids of the memoised results that several calls got."""
        return {i for i, (_, count) in self.handed.items() if count > 1}

    def own(self, tensor: Tensor, copies: dict[int, Tensor]) -> Tensor:
        """An instance's own ``tensor``, a memoised result that several calls got, for its
        results (``copies``: the instance's, by id): eagerly each call made its own, so a
        write into one instance's result must not reach another's. A new view where the
        result shares memory with what it was made from (``W.t()``, ``W.data``: a write
        reaches ``W``, as eagerly), else a copy (``W * 2``)."""
        made = copies.get(id(tensor))
        if made is None:
            _, args, kwargs = self.memo[self.handed[id(tensor)][0]]
            views = _views_inputs(tensor, args, kwargs)
            made = copies[id(tensor)] = tensor.view_as(tensor) if views else tensor.clone()
        return made

    def own_results(self, result: Any, lazies: Any, twice: set[int]) -> Any:
        """One instance's ``result`` with ``lazies`` applied to its lazy values and each of
        the memoised results ``twice`` (:meth:`handed_twice`) made its own (:meth:`own`)."""
        copies: dict[int, Tensor] = {}
        return map_lazies(
            lazies, result, tensors=lambda t: self.own(t, copies) if id(t) in twice else t
        )

    def sources(self, tensors: Iterable[Tensor]) -> tuple[tuple[Tensor, int], ...]:
        """The tensors from outside that memoised results among ``tensors`` were computed
        from, each with its version then (``W * 2`` in a module's trace: made from ``W``)."""
        made = self.made_from
        return tuple(p for t in tensors for p in made.get(id(t), ()))

    def _set_data(self, func: Any, args: tuple[Any, ...]) -> tuple[Any, str]:
        """``t.data = x`` of a shared tensor. Eagerly ``t.data`` is ``t``'s memory without its
        version counter, and ``t.data = x`` swaps the memory without a bump, so a write either
        way would reach the ops recorded before it unseen (they run later, on the new values)
        and leave stale results in the memo: here ``t.data`` is ``t.detach()`` (see
        :meth:`call`), whose writes count as ``t``'s, and the swap bumps ``t``'s counter."""
        tensor = args[0]
        with torch._C.DisableTorchFunction():
            self.written(tensor, func)
            func(*args)
            _bump(tensor)
        return None, WRITES

    def written(self, target: Tensor, func: Any) -> None:
        """``target`` is about to be written in place: if it is (or views) a memoised result,
        take the result out of the memo, or refuse where several calls got it."""
        with torch._C.DisableTorchFunction():  # ._base is a getter: not for the recorder
            base = target._base
        for tensor in (target, base):
            if tensor is None or id(tensor) not in self.handed:
                continue
            key, count = self.handed.pop(id(tensor))
            del self.memo[key]
            if count > 1:
                raise UnsupportedOpError(
                    f"{func_name(func)} at {user_site()} writes in place into the result of a "
                    f"call on tensors from outside batch_map that {count} calls got: batch_map "
                    "computes such a call once and hands its result to every call with the "
                    "same arguments, where eagerly each gets a tensor of its own. Write into "
                    "a copy (.clone()) or out of place."
                )


def _views_inputs(result: Tensor, args: Any, kwargs: Any) -> bool:
    """Whether a memoised result shares memory with a tensor it was made from (``W.t()``),
    rather than being a new tensor (``W * 2``)."""
    memory = _memory(result)
    return memory is not None and any(
        isinstance(x, Tensor) and _memory(x) == memory for x in tree_leaves((args, kwargs))
    )


def _memory(tensor: Tensor) -> int | None:
    """Where ``tensor``'s memory starts (``None`` for a tensor without storage, a sparse one)."""
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


def _requires_grad(tensor: Any) -> bool:
    with torch._C.DisableTorchFunction():  # a getter: not for the recorder
        return bool(tensor.requires_grad)


def _bump(tensor: Tensor) -> None:
    """Count a change eager PyTorch makes without a version bump (``t.data = x``, a change of
    ``requires_grad``) as a write into ``tensor``: ops recorded before it that read ``tensor``
    are then refused when they would run (see ``Recorder.flush``), and the memo recomputes."""
    with torch._C.DisableTorchFunction(), contextlib.suppress(RuntimeError):  # inference tensors
        torch.autograd.graph.increment_version(tensor)


def refuse_stale(graph: Graph) -> None:
    """Refuse to run pending nodes that read a tensor from outside changed since they were
    recorded (in place, through ``.data``, or its ``requires_grad``), or whose cached call
    read a tensor made from one changed since (see ``Signature.derived``): they would all
    see it as it is at the end."""
    signatures = graph.signatures
    for pool in graph.touched:  # the buffers holding pending nodes
        sig = signatures[pool]
        for seen, why in ((sig.shared, _STALE_READ), (sig.derived, _STALE_DERIVED)):
            if (tensor := _changed(seen)) is not None:
                where = {"shape": tuple(tensor.shape), "name": sig.name, "site": sig.site}
                raise UnsupportedOpError(why.format(**where))


_STALE_READ = (
    "a tensor from outside batch_map ({shape}) read by {name} at {site} was changed in place "
    "(or through .data, or its requires_grad) before batch_map ran the recorded ops, so they "
    "would all see it as it is at the end. Change it outside the function given to "
    "batch_map, or out of place."
)
_STALE_DERIVED = (
    "a tensor from outside batch_map ({shape}) was changed in place between calls of {name} "
    "(at {site}), whose cached calls read a tensor made from it before the change: they "
    "would all use that. Change it outside the function given to batch_map, or mark the "
    "module bf.no_cache."
)


def _changed(seen: tuple[tuple[Tensor, int], ...]) -> Tensor | None:
    """The first of these tensors whose version is no longer the one seen."""
    return next((t for t, v in seen if version(t) != v), None)
