"""New signatures inside ``batch_map``: a call of a kind not seen in the run.

A signature holds everything its nodes share: the op and its argument template, the batching
rule, the output metas (inferred once per op and input metas on meta tensors), the shared
tensors it reads and the grad mode. A new length of a ragged family takes all of that from the
family's first member.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from ..errors import UnsupportedOpError
from ..graph import OUT_MASK, Graph, Signature, Slot, TensorMeta
from ..opbase import LOOP, VMAP
from ..ops import rule_for
from ..ragged import Family, join_family, member_of
from ..signature import INHERITS_GRAD
from .function import BatchedFunction
from .inference import (
    WithNones,
    check_inputs,
    infer_outputs,
    lazy_metas,
    shared_tensors,
    template,
)
from .module_state import EPOCH
from .semantics import grad_rule, refuse_unrecordable
from .sites import func_name, user_site, version
from .tensor import Lazy

Tensor = torch.Tensor


class SignatureMaker:
    """The recorder's making of signatures (a base class of ``Recorder``).

    It uses the recorder's ``graph``, ``ragged`` (whether families batch across lengths),
    ``by_identity`` (whether the call's key holds an object by identity), ``_meta_cache``
    (meta tensors reused by shape inference) and ``functions``.
    """

    graph: Graph
    ragged: bool
    by_identity: bool
    _meta_cache: dict[int, tuple[Tensor, Tensor]]
    # the signatures of bf.function calls, the modules each reaches and the count of module
    # attribute sets when it was made (see function.refuse_changed)
    functions: list[tuple[Signature, list[Any], int]]

    def _signature(
        self,
        key: tuple[Any, ...],
        func: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        mode: int,
    ) -> Signature:
        """Make the signature of a new kind of node: template, rule, output shapes, checks."""
        if self.ragged and self.graph.families:
            metas: list[TensorMeta] = []
            lazy_metas(args, metas)
            lazy_metas(kwargs, metas)
            first_lazy = bool(args) and type(args[0]) is Lazy
            member = member_of(self.graph.families, key, func, first_lazy, tuple(metas))
            if member is not None:  # a new length of a known family: all else is its first's
                return self._member_signature(key, tuple(metas), *member)
        lazies: list[Lazy] = []
        targs, tkwargs = template(args, lazies), template(kwargs, lazies)
        in_metas = tuple(lazy._meta for lazy in lazies)
        site = user_site()
        name = func_name(func)
        refuse_unrecordable(name, func, args, kwargs, Lazy, site)
        device = moved_to(name, targs, tkwargs) or check_inputs(
            name, site, in_metas, (targs, tkwargs)
        )
        shared: list[bool] = []  # a bf.function's: whether its outputs share memory
        if isinstance(func, BatchedFunction):
            if func.batched and shared_tensors((targs, tkwargs)):
                raise UnsupportedOpError(
                    f"{name} at {site}, a bf.function with batched=True, gets a tensor from "
                    "outside batch_map as an argument: inside batch_map it comes without a "
                    "batch dimension, where the call on one instance gives every argument "
                    "one. Reach it through the function (a closure or an nn.Module's weight)."
                )
            rule, eager = func.rule, func.eager_for_shapes(shared)
        else:
            rule, eager = rule_for(func, targs, tkwargs, in_metas), None
        multi, outs = infer_outputs(
            func, eager, name, site, targs, tkwargs, in_metas, self._meta_cache
        )
        if isinstance(multi, WithNones):  # the node computes the tensors alone, by fallback
            func, rule = multi.drop(func), VMAP
        if rule is VMAP and (torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda")):
            rule = LOOP  # vmap runs some ops (conv1d, addmm) past autocast's casts: once each
        if len(outs) > OUT_MASK + 1:
            raise UnsupportedOpError(
                f"{name} at {site} returns {len(outs)} tensors; batchfold records at most "
                f"{OUT_MASK + 1} outputs of one op. Index or slice the tensor instead of "
                "unbinding all of it."
            )
        out_metas = tuple(TensorMeta.of(shape, dtype, device) for shape, dtype in outs)
        sig = self.graph.signature(
            key,
            func=func,
            rule=rule,
            name=name,
            template=(targs, tkwargs),
            in_metas=in_metas,
            out_metas=out_metas,
            multi=multi,
            site=site,
        )
        sig.grad = 0 if mode == 2 else mode  # inference mode computes as no_grad does
        sig.shared = tuple((t, version(t)) for t in shared_tensors((targs, tkwargs)))
        if not isinstance(func, BatchedFunction):
            asked = tkwargs.get("requires_grad") is True  # zeros_like(x, requires_grad=True)
            sig.set_grad_rule(grad_rule(func, mode, sig.shared, asked))
            if sig.grad_rule == INHERITS_GRAD:
                sig.set_output_grad(_own_reads(name, (targs, tkwargs), mode, len(out_metas)))
        else:  # a bf.function: as its calls on zeros show
            sig.set_output_grad(func.output_grad((targs, tkwargs), in_metas, mode == 1))
            if any(shared):  # as its run for shapes above found
                self.graph.views.add(sig.id)  # its outputs are marked as views (writes.py)
            modules, tensors = func.reached()  # checked before the batch runs (refuse_stale)
            sig.shared += tuple((t, version(t)) for t in tensors)
            self.functions.append((sig, modules, EPOCH[0]))
        if self.ragged:
            join_family(self.graph.families, sig, key)
        # kept for later runs when its key holds no object by identity (see lazy/graphs.py)
        sig.keep = not (self.by_identity or sig.shared or isinstance(func, BatchedFunction))
        return sig

    def _member_signature(
        self,
        key: tuple[Any, ...],
        in_metas: tuple[TensorMeta, ...],
        family: Family,
        length: int,
        out_metas: tuple[TensorMeta, ...],
    ) -> Signature:
        """A new length of a family: the same call as its first member's but for the metas.

        Its template, rule, shared tensors, grad mode and checks are the first member's: the
        key, equal but for the lengths, says the call is the same.
        """
        first = self.graph.signatures[family.rep]
        sig = self.graph.signature(
            key,
            func=first.func,
            rule=first.rule,
            name=first.name,
            template=first.template,
            in_metas=in_metas,
            out_metas=out_metas,
            multi=first.multi,
            site=first.site,
        )
        sig.grad, sig.shared, sig.grad_rule = first.grad, first.shared, first.grad_rule
        sig.family, sig.length, sig.pool = family, length, family.rep
        sig.keep = first.keep
        return sig


# calls whose output comes from their first tensor alone (the others lend a shape, a dtype):
# eagerly it requires grad where that tensor does; and calls whose each output comes from the
# tensor at its position
_FIRST_ONLY = frozenset(["view_as", "type_as", "expand_as", "reshape_as", "to"])
_EACH_ITS_OWN = frozenset(
    ["broadcast_tensors", "meshgrid", "atleast_1d", "atleast_2d", "atleast_3d"]
)


def _own_reads(
    name: str, template: tuple[Any, Any], mode: int, outputs: int
) -> tuple[tuple[bool, tuple[int, ...]], ...] | None:
    """Per output, ``(needs, reads)`` (see ``Signature.set_output_grad``) of a call whose
    outputs do not all depend on all its tensors; ``None`` for any other call."""
    if name not in _FIRST_ONLY and name not in _EACH_ITS_OWN:
        return None
    tensors = [t for t in tree_leaves(template) if type(t) is Slot or isinstance(t, Tensor)]
    if name in _FIRST_ONLY:
        tensors = tensors[:1]
    if len(tensors) != outputs:
        return None
    return tuple(
        (False, (t.index,)) if isinstance(t, Slot) else (mode == 1 and t.requires_grad, ())
        for t in tensors
    )


_MOVES = frozenset(["to", "cuda", "cpu", "as_tensor", "asarray", "type", "new_tensor"])


def moved_to(name: str, targs: Any, tkwargs: Any) -> torch.device | None:
    """The device a call moves its per-instance input to (``h.to("cuda")``, ``h.cpu()``,
    ``torch.zeros_like(h, device=d)``), where its outputs are; ``None`` for any other call,
    whose outputs are on its inputs' device."""
    found = tkwargs.get("device")
    if found is None and name == "to":
        found = next((a for a in targs[1:] if isinstance(a, (str, torch.device))), None)
    elif found is None and name in ("cuda", "cpu"):
        found = name if name == "cpu" or len(targs) < 2 else torch.device("cuda", targs[1])
    if found is None or not (name in _MOVES or name.endswith("_like") or name.startswith("new_")):
        return None
    with torch._C.DisableTorchFunction():  # "cuda" is the current CUDA device, as PyTorch says
        return torch.empty(0, device=found).device
