"""The cache keys of module calls on ragged inputs, and the fast path of the common one.

A call on sequences is keyed with the leading dim of its ragged inputs left out
(:func:`ragged_key`), so calls of every length share one entry; :func:`ragged_hit` makes the
same key for the common call (lazy positional arguments of one rank and one length) without
the general walk, and :func:`by_shape` says when such a call goes by its exact shape instead.

Length classes are told apart by their lengths, so a call whose classes happen to have one
length (a molecule of 2 atoms has 2 ordered atom pairs) makes a coarser key than the others.
Such a call takes the macro confirmed for a finer split of its inputs when there is one
(:func:`_splits`): a trace that compared the lengths of two classes was refused, so the
macro's ops do not depend on the classes' lengths differing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..graph import TensorMeta
from ..ragged import family_key, ragged_meta, square_meta
from .inference import lazy_metas
from .kept import kept_keys
from .lengths import FIXED, SQUARE, guards_hold, rows_flag
from .semantics import grad_mode, own_hooks
from .tensor import Lazy

if TYPE_CHECKING:
    from .macros import ModuleCache, _Entry

RAGGED = "ragged call"
BY_SHAPE = object()  # see ragged_hit


def ragged_key(
    cache: ModuleCache, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, list[int], tuple[TensorMeta, ...], tuple[int, ...], tuple[int, ...]] | None:
    """The cache key of a call with its ragged inputs' lengths left out, its input value ids
    and metas, each input's flag (see :mod:`.lengths`) and each length class's length.

    The ragged inputs are those of the highest rank; each distinct leading dim among them is
    a length class, numbered in input order (a molecule's atoms, then its pairs). An input
    ``[L, L]`` of a call of one class is its adjacency. A length may be 0 (see
    :data:`~.ragged_macros.EMPTY_SAFE`); ``None`` when no input has a dim.
    """
    metas: list[TensorMeta] = []
    lazy_metas(args, metas)
    positional = len(metas)
    if kwargs:
        lazy_metas(kwargs, metas)
    found = length_classes(tuple(metas))
    if found is None:
        return None
    classes, lengths = found
    squares: list[int] = []
    if len(lengths) == 1:
        squares = [i for i, m in enumerate(metas) if m.shape == (lengths[0], lengths[0])]
    square = squares[0] if len(squares) == 1 else -1  # several: rows (their key holds L)
    ragged_in = tuple(c >= 0 for c in classes)
    inputs: list[int] = []
    rec = cache.rec
    parts = rec.args_key(args, inputs)
    head = _head(module, grad_mode(), classes)
    kparts = rec.kwargs_key(kwargs, inputs) if kwargs else None
    key = _key(head, parts, kparts, metas, positional, ragged_in, square)
    if len(squares) > 1:  # [L, d] with L == d beside the [L, L] input: the one cached, if any
        earlier = set(kept_keys(module))
        for i in squares:
            square_key = _key(head, parts, kparts, metas, positional, ragged_in, i)
            if _has_macro(cache, square_key) or square_key in earlier:
                square, key = i, square_key
                break
    if len(lengths) < sum(ragged_in) and not _has_macro(cache, key):  # classes of one length
        earlier = set(kept_keys(module))
        for finer in _splits(cache, earlier, head, classes):
            finer_key = _key(finer, parts, kparts, metas, positional, ragged_in, -1)
            if _has_macro(cache, finer_key) or finer_key in earlier:
                split = finer[4]
                lengths = tuple(lengths[classes[split.index(c)]] for c in range(max(split) + 1))
                flags = tuple(FIXED if c < 0 else rows_flag(c) for c in split)
                return finer_key, inputs, tuple(metas), flags, lengths
    flags = tuple(FIXED if c < 0 else rows_flag(c) for c in classes)
    if square >= 0:  # [L, d] with d == L, say: the call of rows, if that is cached
        rows_key = _key(head, parts, kparts, metas, positional, ragged_in, -1)
        rows = cache.entries.get(rows_key)
        if rows is not None and rows.macro is not None:
            return rows_key, inputs, tuple(metas), flags, lengths
        if rows is None and rows_key in kept_keys(module):  # kept by an earlier batch_map:
            return rows_key, inputs, tuple(metas), flags, lengths  # checked there as rows
        flags = tuple(SQUARE if i == square else f for i, f in enumerate(flags))
    return key, inputs, tuple(metas), flags, lengths


def ragged_hit(
    cache: ModuleCache, module: nn.Module, metas: list[TensorMeta], inputs: list[int], mode: int
) -> Any:
    """The common ragged call on a fast path: positional lazy arguments of one rank (2 or
    more) whose leading lengths are its length classes (a sequence's one, or a molecule's
    atoms and pairs), at most one ``[L, L]`` input (a graph's adjacency) in a call of one
    length, and a confirmed macro whose guards hold. Its lazy result; :data:`BY_SHAPE` for a
    call of the lengths its module was traced at (keyed by shape, as :meth:`ModuleCache.call`
    does then); or ``None`` (then :func:`ragged_key` and :func:`call_ragged`). The key is the
    one :func:`ragged_key` makes for such a call; ``mode`` is :func:`grad_mode`'s."""
    rank = len(metas[0].shape)
    if rank < 2:
        return None
    lengths: list[int] = []
    classes = []
    squares = []
    for i, m in enumerate(metas):
        s = m.shape
        if len(s) != rank or s[0] == 0:
            return None  # inputs not ragged, or of 0 rows: ragged_key's to say
        if s[0] in lengths:
            classes.append(lengths.index(s[0]))
        else:
            classes.append(len(lengths))
            lengths.append(s[0])
        if rank == 2 and s[1] == s[0]:
            squares.append(i)
    square = squares[0] if len(lengths) == 1 and squares else -1  # one length: an adjacency
    if square >= 0 and len(squares) > 1:
        return None  # several [L, L]: which is the adjacency is ragged_key's to say
    head = _head(module, mode, tuple(classes))
    flat = tuple(ragged_meta(m) for m in metas)  # _key's, every input ragged
    entry = cache.entries.get((*head, flat))
    if square >= 0 and (entry is None or entry.macro is None):
        adjacency = square_meta(metas[square])  # else the rows call, as in ragged_key
        flat = tuple(adjacency if i == square else r for i, r in enumerate(flat))
        entry = cache.entries.get((*head, flat))
    if entry is None:
        return None
    found = tuple(lengths)
    if entry.macro is None:
        return BY_SHAPE if by_shape(entry, found, True) else None
    if own_hooks(module) or not guards_hold(entry.guards, found):
        return None
    cache.hits += 1
    return entry.macro.node(cache.rec, inputs, tuple(metas), found)


def by_shape(entry: _Entry | None, lengths: tuple[int, ...], rows: bool) -> bool:
    """Whether a call on sequences goes by shape (keyed like any other call): its module has
    a ragged entry without a macro, traced at these lengths and no other yet (a fixed size,
    maybe), or refused by the ragged trace while the call has no input of rank 2 or more
    (word ids). ``rows``: whether it has one."""
    if entry is None or entry.macro is not None:
        return False
    if entry.reason is not None:
        return not rows
    return entry.length == lengths


def _has_macro(cache: ModuleCache, key: Any) -> bool:
    entry = cache.entries.get(key)
    return entry is not None and entry.macro is not None


def _splits(
    cache: ModuleCache, earlier: set[Any], head: tuple[Any, ...], classes: tuple[int, ...]
) -> list[tuple[Any, ...]]:
    """Heads of this module's cached or kept (``earlier``) ragged calls whose length classes
    split ``classes`` finer: the same inputs ragged, and inputs of one class there of one
    class here."""
    found = []
    for key in {*cache.entries, *earlier}:
        if type(key) is not tuple or len(key) < 5 or key[:4] != head[:4]:
            continue
        split = key[4]
        if len(split) != len(classes) or split == classes:
            continue
        pairs = set(zip(split, classes, strict=True))
        # -1 stays -1, and each finer class lies within one class of the call's
        if all((a < 0) == (b < 0) for a, b in pairs) and len({a for a, _ in pairs}) == len(pairs):
            found.append(key[:5])
    return sorted(set(found), key=lambda h: -max(h[4]))  # the finest first


def _head(module: nn.Module, mode: int, classes: tuple[int, ...]) -> tuple[Any, ...]:
    """The start of a ragged call's cache key (see :func:`ragged_key`)."""
    return (RAGGED, id(module), module.training, mode, classes)


def length_classes(
    metas: tuple[TensorMeta, ...],
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """Each input's length class (-1: not ragged) and each class's length: the inputs of the
    highest rank are ragged, one class per distinct leading dim (0 included). ``None`` if no
    input has a dim."""
    rank = max((len(m.shape) for m in metas), default=0)
    if rank == 0:
        return None
    lengths: list[int] = []
    classes = []
    for m in metas:
        if len(m.shape) != rank:
            classes.append(-1)
            continue
        length = m.shape[0]
        if length not in lengths:
            lengths.append(length)
        classes.append(lengths.index(length))
    return tuple(classes), tuple(lengths)


def _key(
    head: tuple[Any, ...],
    parts: tuple[Any, ...],
    kparts: tuple[Any, ...] | None,
    metas: list[TensorMeta],
    positional: int,
    ragged_in: tuple[bool, ...],
    square: int,
) -> Any:
    if square < 0 and len(parts) == len(metas) and all(type(p) is TensorMeta for p in parts):
        flat = tuple(ragged_meta(m) if r else m for m, r in zip(parts, ragged_in, strict=True))
        key: Any = (*head, flat)
    else:
        key = family_key((*head, parts), ragged_in, square)
    if kparts is not None:
        kwargs_square = square - positional if square >= positional else -1
        key = (*key, family_key(kparts, ragged_in[positional:], kwargs_square))
    return key


_INDEX_DTYPES = frozenset([torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8])
SEQUENCE: dict[TensorMeta, bool] = {}
"""``is_sequence`` of each meta seen (metas are interned): the cache's fast path reads it."""


def is_sequence(meta: TensorMeta) -> bool:
    """A sequence (2 or more dims) or a vector of integers (a sentence's word ids)."""
    rank = len(meta.shape)
    return rank >= 2 or (rank == 1 and meta.dtype in _INDEX_DTYPES)


def takes_sequences(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a call gets a lazy tensor of 2 or more dims (a sequence, say), or a vector of
    integers (a sentence's word ids)."""
    return _any_sequence(args) or (bool(kwargs) and _any_sequence(kwargs.values()))


def _any_sequence(items: Any) -> bool:
    for item in items:
        kind = type(item)
        if kind is Lazy:
            found = is_sequence(item._meta)
        elif kind is tuple or kind is list or kind is dict:
            found = _any_sequence(item.values() if kind is dict else item)
        else:
            continue
        if found:
            return True
    return False
