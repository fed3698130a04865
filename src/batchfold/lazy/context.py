"""Which ``batch_map`` is recording in this thread: a stack of recorders, one per thread."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from .recorder import Recorder

THREAD = threading.local()
"""This thread's state: ``.active``, its recorders, innermost last (see :func:`active_stack`)."""


def active_stack() -> list[Recorder]:
    """This thread's recorders, innermost last (made on first use)."""
    active = getattr(THREAD, "active", None)
    if active is None:
        active = THREAD.active = []
    return active


def active_recorder() -> Recorder | None:
    """The recorder of the ``batch_map`` running in this thread, if any."""
    active = getattr(THREAD, "active", None)
    return active[-1] if active else None


DRY_NODES = 1 << 40
"""The node number of a dry trace's first node: past any node of a real graph (see
:mod:`.dry_trace`)."""


class DryStop(BaseException):
    """Stops a dry trace (see :mod:`.dry_trace`) before it does what it could not undo: read a
    value, draw random numbers, write into a tensor from outside it, set a module's attribute.
    Not an ``Exception``, so that a forward's own ``except Exception`` lets it through."""


def dry() -> bool:
    """Whether a dry trace runs in this thread."""
    return getattr(THREAD, "dry", False)


def stop_dry(what: str) -> NoReturn:
    """Stop this thread's dry trace at ``what``; noted, so that a forward that catches the
    stop (``except BaseException``) still fails the trace."""
    THREAD.dry_stopped = True
    raise DryStop(what)
