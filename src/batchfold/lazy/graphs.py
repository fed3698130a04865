"""Graphs that outlive a ``batch_map``: the signatures one run made serve the next.

Making a signature (output shapes, a ragged family's member for a new length, the user's
source line) costs as much as recording tens of nodes, and per-instance code on tensors of
varying size makes new ones for every new length: for ragged code, about half of recording.
A run's graph is therefore kept when ``batch_map`` returns (:meth:`Graph.retire` drops its
nodes and the signatures that hold objects by identity) and handed to the next run of this
thread, which finds the signatures of the lengths seen before.

Graphs are kept per thread (a graph serves one recorder at a time; a nested ``batch_map``
takes another), and per what shapes and dtypes depend on besides a call's key: whether
families batch across lengths, the default dtype, autocast.
"""

from __future__ import annotations

import threading
from typing import Any

from ..graph import Graph
from .semantics import run_context

MAX_SIGNATURES = 20_000
"""A graph keeping more signatures than this starts afresh (a program of very many shapes)."""

_THREAD = threading.local()


def _context(ragged: bool) -> tuple[Any, ...]:
    return (ragged, *run_context())


def _free() -> dict[tuple[Any, ...], list[Graph]]:
    free = getattr(_THREAD, "free", None)
    if free is None:
        free = _THREAD.free = {}
    return free


def take(ragged: bool) -> tuple[Graph, Any]:
    """A graph for a new run of this thread (a kept one, or a new one), and the context to
    hand it back under."""
    context = _context(ragged)
    kept = _free().get(context)
    return (kept.pop() if kept else Graph()), context


def give_back(graph: Graph, context: Any) -> None:
    """End ``graph``'s run (:meth:`Graph.retire`) and keep it for this thread's next run in
    the ``context`` it was taken in."""
    gone = [key for key, held in graph.macros.items() if held.macro.module() is None]
    for key in gone:  # its module is gone: so are its signatures (nothing else holds it)
        del graph.macros[key]
    graph.retire()
    if len(graph.signatures) > MAX_SIGNATURES:
        graph.release()
    _free().setdefault(context, []).append(graph)


def forget() -> None:
    """Drop this thread's kept graphs (tests; a program that wants every signature made anew)."""
    _free().clear()
