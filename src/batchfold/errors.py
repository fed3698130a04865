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


class ValueReadError(BatchfoldError, RuntimeError):
    """A lazy value's contents were read where batchfold cannot pause the instance."""


class UnsupportedOpError(BatchfoldError, NotImplementedError):
    """An operation cannot be recorded lazily (for example, its output shape depends on values)."""


class InstanceError(BatchfoldError, RuntimeError):
    """The code of one instance raised; ``index`` is that instance's position in the batch."""

    def __init__(self, message: str, index: int) -> None:
        super().__init__(message)
        self.index = index


LAZY_AFTER_RUN = """\
{what} of a lazy value recorded by batch_map, after that batch_map call returned.
Lazy values live only inside the function given to batch_map; use the tensors it returns:

    wrong:  batch_map(lambda t: saved.append(encode(t)), trees); saved[0] + 1
    right:  roots = batch_map(encode, trees); roots[0] + 1"""

VALUE_READ = """\
{what} reads the value of a lazy tensor (recorded at {site}), but batch_map is running this
instance outside a pausable context, so the value cannot be computed yet.
Keep value reads inside the function given to batch_map, or compute the values first:

    wrong:  y = encode(tree); threading.Thread(target=lambda: y.item()).start()
    right:  def step(tree): y = encode(tree); return y.item()"""
