"""A schedule's result: the :class:`Plan` of batched steps, and where each step's inputs come from.

:func:`batchfold.schedule.schedule` makes a plan from a graph's pending nodes; the executor
(:mod:`batchfold.execute`) runs it. A plan pickles with stand-ins for its ops (see
:class:`Step`), so a DataLoader worker can schedule it and the front end that made it binds
and runs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np

from .graph import Signature

# a gather part: (step, output, start, stop), (step, output, rows) or (step, output, chunk)
Part: TypeAlias = tuple[int, int, int, int] | tuple[int, int, np.ndarray | int]


@dataclass(frozen=True, slots=True)
class Gather:
    """Where the rows of one step input come from.

    ``parts`` are ``(step, output, start, stop)`` slices, ``(step, output, rows)`` index
    arrays or ``(step, output, j)``, chunk ``j`` of that output's :class:`Fanout`,
    concatenated in order; ``order``, when set, then permutes the concatenation into the
    step's row order. A single slice part is a view: nothing is copied.
    """

    parts: tuple[Part, ...]
    order: np.ndarray | None = None


@dataclass(frozen=True, slots=True)
class Fanout:
    """One step output handed to all the gathers of its plan that read it, at once.

    ``rows`` (every row those gathers read, reader after reader; ``None`` when that is each
    row once, in order) is gathered in one call and split into chunks of ``sizes``; a reader's
    part ``(step, output, j)`` is chunk ``j``. The backward pass then does work in proportion
    to the output once, where k separate gathers would each add an output-sized gradient.
    """

    output: int
    rows: np.ndarray | None
    sizes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Step:
    """One batched call: ``sig``'s op over ``nodes`` (row i of the output is ``nodes[i]``).

    ``fanouts`` say which outputs are split for their readers right after the call; a source
    step (no inputs) carries its nodes' ``payloads``. A ragged step (nodes of one
    :class:`~batchfold.ragged.Family` with different lengths; ``sig`` is one of theirs)
    carries each node's ``lengths`` and holds its ragged values packed.

    A step pickles with its signature's ``ref`` in place of the signature (and without the
    payloads of a ``"constant"`` source); read back, its ``sig`` is a stand-in with id
    :data:`UNBOUND` that the front end which made the plan binds again. A step whose
    signature has no ``ref`` refuses to pickle.
    """

    index: int
    sig: Signature
    nodes: np.ndarray  # [n] global node ids
    gathers: tuple[Gather, ...]
    fanouts: tuple[Fanout, ...] = ()
    payloads: list[Any] | None = None  # a source step's per-node values, in row order
    lengths: np.ndarray | None = None  # a ragged step's: each node's leading-dim length

    def __str__(self) -> str:
        sources = sorted({part[0] for g in self.gathers for part in g.parts})
        reads = f"<- steps {', '.join(map(str, sources))}" if sources else ""
        name = self.sig.name if self.lengths is None else f"{self.sig.name} (ragged)"
        return f"step {self.index:4d}  {name:<22s} x{len(self.nodes):<6d} {reads}".rstrip()

    def __reduce__(self) -> tuple[Any, ...]:
        sig = self.sig
        if sig.ref is None:
            raise TypeError(
                f"step {self.index} ({sig.name}, recorded at {sig.site or 'an unknown place'}) "
                "refers to live modules: it was recorded by per-instance code (batch_map, or "
                "Function(..., per_instance=True)), so a plan holding it runs only in the "
                "process that scheduled it"
            )
        payloads = None if sig.source == "constant" else self.payloads
        stand_in = (sig.ref, sig.name, sig.source, sig.out_metas)
        fields = (self.nodes, self.gathers, self.fanouts, payloads, self.lengths)
        return (_unpickled_step, (self.index, stand_in, *fields))


UNBOUND = -1
"""The id of a step's stand-in signature after unpickling, until its front end binds it."""


def _unbound_op(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("an unbound step was run; Executor.run refuses those first")


def _unpickled_step(index: int, stand_in: tuple[Any, str, Any, Any], *fields: Any) -> Step:
    ref, name, source, out_metas = stand_in
    sig = Signature(
        UNBOUND,
        ("unbound", ref),
        func=_unbound_op,
        rule=None,
        name=name,
        out_metas=out_metas,
        source=source,
        ref=ref,
    )
    return Step(index, sig, *fields)


@dataclass(frozen=True, slots=True)
class Plan:
    """The steps that compute one segment of a graph, and where each of its nodes lands.

    Node ``node_base + i`` is row ``node_row[i]`` of step ``node_step[i]``'s outputs. A plan
    whose signatures all have a ``ref`` pickles (see :class:`Step`): a DataLoader worker
    can schedule it, and the front end that made it binds and runs it.
    """

    steps: list[Step]
    node_base: int
    node_step: np.ndarray
    node_row: np.ndarray

    @property
    def num_nodes(self) -> int:
        """Number of nodes the plan computes (not those it leaves out: see ``schedule``)."""
        return int(np.count_nonzero(self.node_step >= 0))

    def __str__(self) -> str:
        mean = self.num_nodes / max(len(self.steps), 1)
        head = f"Plan: {self.num_nodes} nodes in {len(self.steps)} steps (mean batch {mean:.1f})"
        return "\n".join([head] + [str(step) for step in self.steps])
