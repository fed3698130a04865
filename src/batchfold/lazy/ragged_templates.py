"""What a module call on ragged inputs recorded, as a template for every length.

A trace of such a call (see :mod:`.ragged_macros`) becomes a :class:`RaggedTemplate` when
every op that reads a ragged value has a ragged rule (:mod:`batchfold.ragged`) for exactly
those inputs at the call's length, and ops on fixed values only read fixed values; the
template records which ops run on packed rows, of which length class, and replays them.
"""

from __future__ import annotations

import numpy as np
import torch

from ..step_calls import run_op, run_ragged, sources_batch
from .lengths import FIXED, ROWS, SQUARE, class_of, rows_flag
from .traces import Template, reads_fit, same_ops

Tensor = torch.Tensor
EMPTY_SAFE = frozenset(
    [
        *("rows", "elementwise", "mv", "weighted", "blockdiag", "index_rows", "index_add"),
        *("sum", "sum_all", "softmax", "log_softmax", "cross_entropy_sum"),
    ]
)
"""The ragged kinds whose packed form gives eager's result for an instance of 0 rows (an
empty output, or zeros for a sum). A maximum of no rows is an error in eager PyTorch, a mean
is NaN: calls with such ops are recorded op by op for a sequence of 0 rows."""


class RaggedTemplate(Template):
    """A traced call's ops, which of them run on packed rows, and which outputs are ragged.

    ``op_ragged[j]`` is ``None`` for an op on fixed values, else the length class of its
    node and of each secondary input (the rows an index reads or adds into).
    ``class_input[c]`` is a call input of length class ``c``.
    """

    def __init__(
        self,
        found: Template,
        op_ragged: list[tuple[int, tuple[tuple[int, int], ...]] | None],
        ragged_out: tuple[bool, ...],
        class_input: tuple[int, ...],
    ) -> None:
        super().__init__(found.ops, found.outputs, found.structure, found.fallbacks)
        self.op_ragged, self.ragged_out = op_ragged, ragged_out
        self.class_input = class_input
        self.empty_ok = all(
            ragged is None or (op.family is not None and op.family.kind in EMPTY_SAFE)
            for (op, _, _), ragged in zip(found.ops, op_ragged, strict=True)
        )
        """Whether a call with a length of 0 may replay it (see :data:`EMPTY_SAFE`)."""

    def same_as(self, other: Template) -> bool:
        """Whether two traces (of any lengths) recorded the same ops on the same values."""
        return (
            isinstance(other, RaggedTemplate)
            and self.op_ragged == other.op_ragged
            and same_ops(self, other, [r is not None for r in self.op_ragged])
        )

    def replay_packed(
        self, inputs: list[Tensor], lengths: np.ndarray, sizes: dict[int, np.ndarray]
    ) -> tuple[Tensor, ...]:
        """Run the ops on ragged inputs packed ``[sum L, ...]``, fixed ones ``[n, ...]``:
        ``lengths`` holds each node's length of class 0, ``sizes`` each node's length in
        the inputs of other classes."""
        n = len(lengths)
        of_class = [lengths, *(sizes[i] for i in self.class_input[1:])]
        values: list[tuple[Tensor, ...] | None] = []
        for (op, refs, payload), ragged, done in zip(
            self.ops, self.op_ragged, self.dropped_after, strict=True
        ):
            args = [inputs[r[1]] if r[0] == 0 else values[r[1]][r[2]] for r in refs]  # type: ignore[index]
            if not op.in_metas:  # a constant the call made
                values.append((sources_batch(op, [payload] * n),))
            elif ragged is not None:
                cls, secondary = ragged
                op_sizes = {i: of_class[c] for i, c in secondary}
                values.append(run_ragged(op, args, op_sizes, of_class[cls]))
            else:
                values.append(run_op(op, args, n, self.fallbacks))
            for j in done:
                values[j] = None
        return tuple(values[j][o] for _, j, o in self.outputs)  # type: ignore[index]


def ragged_template(
    found: Template, flags: tuple[int, ...], lengths: tuple[int, ...]
) -> RaggedTemplate | str:
    """``found`` as a template for every length, or why it cannot be one.

    ``flags`` says of each call input whether it is fixed, rows of a length class or the
    ``[L, L]`` input (see :mod:`.lengths`); ``lengths`` gives each class's length.
    """
    made: list[tuple[int, ...]] = []

    def flag(ref: tuple[int, ...]) -> int:
        return flags[ref[1]] if ref[0] == 0 else made[ref[1]][ref[2]]

    op_ragged: list[tuple[int, tuple[tuple[int, int], ...]] | None] = []
    for sig, refs, _ in found.ops:
        reads = tuple(flag(r) for r in refs)
        if not any(reads):
            op_ragged.append(None)
            made.append((FIXED,) * len(sig.out_metas))
            continue
        family = sig.family
        if family is None:
            return f"{sig.name} (at {sig.site}) has no ragged rule for its inputs"
        cls = reads_fit(sig, reads, lengths)
        if cls is None:
            return (
                f"{sig.name} (at {sig.site}) reads values of other lengths than its ragged "
                f"rule ({family.kind}) takes"
            )
        secondary = tuple((i, class_of(reads[i])) for i in family.secondary)
        op_ragged.append((cls, secondary))
        made.append(tuple(rows_flag(cls) if r else FIXED for r in family.ragged_out))
    outs = tuple(flag(r) for r in found.outputs)
    if SQUARE in outs:
        return "returns its [L, L] input"
    if any(o > SQUARE for o in outs):
        return "returns rows of another length than its first ragged input's"
    class_input = tuple(
        next(i for i, f in enumerate(flags) if f and class_of(f) == c) for c in range(len(lengths))
    )
    return RaggedTemplate(found, op_ragged, tuple(o == ROWS for o in outs), class_input)
