"""Which ``batch_map`` is recording in this thread: a stack of recorders, one per thread."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

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
