"""Ragged batching: nodes whose per-instance shapes differ only in their leading dimension.

Two nodes batch together when their signatures are equal, which needs equal shapes. A
*family* joins the signatures of one op whose per-instance inputs differ only in the length
``L`` of their leading dimension (a sentence's ``[T, d]`` states, a molecule's ``[atoms, d]``
features), where the op treats that dimension row by row or reduces over it. The scheduler
groups a family's nodes as one signature's; a step whose nodes have different lengths holds
each ragged value *packed*: the rows of all its nodes concatenated, ``[sum L, *rest]``, with
offsets. Row-wise ops (elementwise, ``linear``, ``x @ W``, ``layer_norm``, ``embedding``,
dropout, softmax and reductions over other dims, ``cat`` along other dims) run once on the
packed rows; reductions over the leading dimension (``sum``, ``mean``, ``amax``,
``logsumexp``, ``softmax``, ``log_softmax``, ``w @ H``) run as segment operations. Memory
grows with the total number of rows, never with batch x longest instance.

Every other op batches by exact shape, as before; values move between packed and per-shape
steps through the executor's gathers.

This module holds the family bookkeeping: :class:`Family`, family keys, :func:`join_family`
(a new signature joins its family) and :func:`member_of` (the family a call joins, known
before it runs). Which ops have a ragged form is decided in :mod:`batchfold.ragged_kinds`,
and packed steps run in :mod:`batchfold.ragged_kernels`; the names used elsewhere are
re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from .graph import Signature, Slot, TensorMeta
from .ragged_kernels import expand_rows, run_family
from .ragged_kinds import MATMUL_OPS, classify, generic_pattern, member_pattern

__all__ = [
    "Family",
    "RaggedMeta",
    "classify",
    "expand_rows",
    "family_key",
    "generic_pattern",
    "join_family",
    "member_of",
    "member_pattern",
    "ragged_meta",
    "run_family",
    "square_meta",
]


@dataclass(slots=True, eq=False)
class Family:
    """The signatures of one op that batch across leading-dimension lengths.

    ``kind`` is ``"rows"`` (the op runs on the packed rows as it is), ``"elementwise"`` (the
    same, after per-instance inputs without the leading dim are repeated for every row),
    ``"mv"`` (``[L, d] @ [d]``), ``"macro"`` (a module call's traced ops, see
    ``lazy.ragged_macros``), ``"weighted"`` (``[L] @ [L, d]``), ``"blockdiag"``
    (``[L, L] @ [L, d]`` or ``[L, L] @ [L]``: an adjacency times states), a segment reduction
    (``"sum"``, ``"mean"``, ``"amax"``, ``"logsumexp"``, ``"softmax"``, ``"log_softmax"``),
    ``"source"`` (per-instance tensors to concatenate) or ``"square"`` (per-instance tensors
    ``[L, L, *rest]``, such as an adjacency, packed as ``[sum L * L, *rest]``: one step for
    every ``L``; see ``Executor``). ``ragged_in`` and ``ragged_out``
    say which inputs and outputs have the ragged leading dim; ``rep`` is the first member's
    signature id, which the scheduler groups by (renumbered with it when a graph is kept for
    another run: ``Graph.retire``). Families compare by identity.
    """

    id: int
    kind: str
    ragged_in: tuple[bool, ...]
    ragged_out: tuple[bool, ...]
    rep: int
    square: int = -1  # "blockdiag": the input that is [L, L] per node, gathered flat
    outs: tuple[TensorMeta, ...] = ()  # the first member's output metas
    secondary: tuple[int, ...] = ()  # ragged inputs whose length is not the node's
    replay: Any = None  # "macro": runs a traced module call's ops on packed inputs


class RaggedMeta:
    """A meta's place in a family key: everything but the length of its leading dim.

    Interned like :class:`~batchfold.graph.TensorMeta`, so that keys holding one hash and
    compare by identity: a ragged module call looks its key up on every call.
    """

    __slots__ = ("rest", "dtype", "device")
    _of: ClassVar[dict[TensorMeta, RaggedMeta]] = {}  # by TensorMeta, itself interned
    _interned: ClassVar[dict[tuple[Any, ...], RaggedMeta]] = {}

    def __init__(self, rest: tuple[int, ...], dtype: Any, device: Any) -> None:
        self.rest, self.dtype, self.device = rest, dtype, device

    @classmethod
    def of(cls, rest: tuple[int, ...], dtype: Any, device: Any) -> RaggedMeta:
        """The one ``RaggedMeta`` with these fields."""
        key = (rest, dtype, device)
        found = cls._interned.get(key)
        return found if found is not None else cls._interned.setdefault(key, cls(*key))

    def __reduce__(self) -> tuple[Any, ...]:
        return (RaggedMeta.of, (self.rest, self.dtype, self.device))

    def __repr__(self) -> str:
        return f"ragged[L, {', '.join(map(str, self.rest))}]".replace(", ]", "]")


def ragged_meta(meta: TensorMeta) -> RaggedMeta:
    """The one :class:`RaggedMeta` of ``meta``."""
    found = RaggedMeta._of.get(meta)
    if found is None:
        found = RaggedMeta._of[meta] = RaggedMeta.of(meta.shape[1:], meta.dtype, meta.device)
    return found


def square_meta(meta: TensorMeta) -> tuple[str, Any, Any]:
    """A ``[L, L]`` input's place in a family key: its dtype and device only."""
    return ("square", meta.dtype, meta.device)


def family_key(key: Any, ragged_in: tuple[bool, ...], square: int = -1) -> Any:
    """``key`` with the meta of every ragged input replaced by its :func:`ragged_meta`.

    A signature key holds its inputs' metas in input order. The ``square`` input
    (``[L, L]``) keeps only its dtype and device.
    """
    return _replace_metas(key, ragged_in, square, [0])


def _replace_metas(
    part: tuple[Any, ...], ragged_in: tuple[bool, ...], square: int, count: list[int]
) -> tuple[Any, ...]:
    # a module-level function, not a closure: a recursive closure is a reference cycle, left
    # for the garbage collector on every call
    out = []
    for item in part:
        kind = type(item)
        if kind is TensorMeta:
            i = count[0]
            count[0] = i + 1
            if i == square:
                item = square_meta(item)
            elif ragged_in[i]:
                item = ragged_meta(item)
        elif kind is tuple:
            item = _replace_metas(item, ragged_in, square, count)
        out.append(item)
    return tuple(out)


COPIES_OF_VIEWS = frozenset(["pick_at", "slice_rows"])
"""Kinds whose packed step copies what eager returns as a view (``x[-1]``, ``x[1:]``): only
in grad mode, where the copy carries ``x``'s grad as the view does; outside it the view keeps
``x``'s ``requires_grad`` and a copy would not, so those calls batch by shape."""


def join_family(families: dict[Any, Family], sig: Signature, key: Any) -> None:
    """Make ``sig`` (just made for ``key``) a member of its family, if it has one."""
    if sig.source is not None:
        meta = sig.out_metas[0]
        if sig.source != "tensor" or not meta.shape:
            return
        shape = meta.shape
        found = ("source", (), (True,), shape[0])
        fkey: Any = ("source", ragged_meta(meta))
        # [L, L, *rest] (an adjacency): packed flat, L * L rows each, unless sequences [n, L,
        # *rest] came first (a sequence as long as its rows are wide batches with them)
        if len(shape) >= 2 and shape[0] == shape[1] and fkey not in families:
            found = ("square", (), (True,), shape[0] * shape[0])
            fkey = ("square", shape[2:], meta.dtype, meta.device)
    else:
        found = classify(sig.func, sig.rule, sig.template, sig.in_metas, sig.out_metas)
        if found is None or (found[0] in COPIES_OF_VIEWS and sig.grad != 1):
            return
        fkey = (found[0], family_key(key, found[1], 0 if found[0] == "blockdiag" else -1))
    kind, ragged_in, ragged_out, length = found
    family = families.get(fkey)
    if family is None:
        square = 0 if kind == "blockdiag" else -1
        secondary = {"index_rows": (0,), "index_add": (1, 2), "slice_rows": (0,)}.get(kind, ())
        if kind == "cat_rows":
            secondary = tuple(range(len(ragged_in)))
        family = Family(
            len(families),
            kind,
            ragged_in,
            ragged_out,
            sig.id,
            square,
            sig.out_metas,
            secondary,
        )
        families[fkey] = family
        if (
            sig.source is None
            # lengths not their inputs', or a row a new length may lack (checked when made)
            and kind not in ("slice_rows", "cat_rows", "pick_at")
            and (square < 0 or len(sig.in_metas[1].shape) == 2)
            and member_pattern(sig.func, _first_is_slot(sig), sig.in_metas) == (ragged_in, length)
        ):
            families[("member", family_key(key, ragged_in, square))] = family
    sig.family, sig.length, sig.pool = family, length, family.rep


def _first_is_slot(sig: Signature) -> bool:
    args = sig.template[0]
    return bool(args) and type(args[0]) is Slot


def member_of(
    families: dict[Any, Family],
    key: Any,
    func: Any,
    first_lazy: bool,
    in_metas: tuple[TensorMeta, ...],
) -> tuple[Family, int, tuple[TensorMeta, ...]] | None:
    """The family a new signature joins and its output metas, known without running the op.

    Only for a family whose ragged inputs are those :func:`member_pattern` finds, and a
    length of at least 1 (an op on 0 rows is run once, in case it refuses them as eager
    PyTorch does).
    """
    found = member_pattern(func, first_lazy, in_metas)
    if found is None or found[1] == 0:
        return None
    length = found[1]
    a = in_metas[0].shape
    # [L, L] @ [L, d]: an adjacency times states, keyed without the square's shape
    square = 0 if func in MATMUL_OPS and a == (length, length) and len(in_metas) == 2 else -1
    family = families.get(("member", family_key(key, found[0], square)))
    if family is None:
        return None
    outs = tuple(
        TensorMeta.of((length, *m.shape[1:]), m.dtype, m.device) if ragged else m
        for m, ragged in zip(family.outs, family.ragged_out, strict=True)
    )
    return family, length, outs
