"""Errors raised by batchfold, each naming what went wrong, where, and a likely fix.

Every class subclasses :class:`BatchfoldError` and the matching built-in error
(``ValueError``, ``TypeError``, ...), so existing ``except`` clauses keep working.
"""

from __future__ import annotations


class BatchfoldError(Exception):
    """Base class of every error batchfold raises on purpose."""


class LazyValueError(BatchfoldError, RuntimeError):
    """A lazy value was used outside the ``batch_map`` call that recorded it."""


class ShapeError(BatchfoldError, ValueError):
    """An operation got arguments whose shapes do not fit; names the user's file and line."""


class DeviceError(BatchfoldError, ValueError):
    """One operation mixed tensors on different devices."""


class DtypeError(BatchfoldError, TypeError):
    """One operation mixed floating-point dtypes; batchfold never casts silently."""


class UnsupportedOpError(BatchfoldError, NotImplementedError):
    """An operation cannot be recorded lazily (for example, its output shape depends on values)."""


LAZY_AFTER_RUN = """\
{what} of a lazy value recorded by batch_map, after that batch_map call returned.
Lazy values live only inside the function given to batch_map; use the tensors it returns:

    wrong:  batch_map(lambda t: saved.append(encode(t)), trees); saved[0] + 1
    right:  roots = batch_map(encode, trees); roots[0] + 1"""
