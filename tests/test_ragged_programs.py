"""Random programs on sequences of any length match eager execution, one instance at a time.

Each instance is a ``[L, DIM]`` sequence (L from 0 up); a program is a list of instructions
over registers holding per-instance sequences and vectors, mixing ops with ragged rules
(row-wise, segment reductions, softmax over rows, products with a per-instance vector or an
adjacency, per-instance ``[L, L]`` and ``[L, L, DIM]`` tensors given as they are, recurrent
layers, cached module calls, picks of a row) with ops that batch by
shape (``flip``, ``cumsum``), in-place writes and grad-mode switches. Ops that need a row are
skipped on empty sequences, so instances of different lengths differ in structure too.
Values and parameter gradients are compared in float64, with both schedulers.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from reference import assert_matches_eager, rounding_floor

DIM = 3
REGISTERS = 3


class Block(nn.Module):
    """A small module on a whole sequence: one cached (ragged) call per instance."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(DIM, DIM)
        self.norm = nn.LayerNorm(DIM)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.norm(torch.relu(self.lin(h)) + h)


class Shared(nn.Module):
    """The parameters a program may use."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(DIM, DIM)
        self.mix = nn.Linear(2 * DIM, DIM)
        self.block = Block()
        self.gru = nn.GRU(DIM, DIM)
        self.q = nn.Parameter(torch.randn(DIM))


ROW_KINDS = [  # skipped on an empty sequence
    "pick",
    "last",
    "amax_rows",
    "logsumexp_rows",
    "gru",
    "set_row",
    "argmax_pick",
    "max_rows",
    "mean_rows",  # eager's mean of no rows is nan, which loss_of would spread everywhere
]
KINDS = [
    "tanh",
    "add",
    "linear",
    "softmax_rows",
    "sum_rows",
    "broadcast",
    "scores",
    "attend",
    "adjacency",
    "flip_cumsum",
    "cat_features",
    "block",
    "in_place",
    "no_grad",
    "log_softmax_rows",
    "cross_entropy_rows",
    "index_add",
    "column",
    "rotate_rows",
    "neighbours",
    "along_features",
    "detach",
    "branch_on_value",
    "where_rows",
    "masked_fill_rows",
    "clamp_rows",
    "sort_features",
    "square_source",
    "square_rows",
    "pair_source",
    *ROW_KINDS,
]


def run(program: list[tuple[str, int, int]], x: torch.Tensor, shared: Shared) -> Any:
    """One instance of ``program`` on the sequence ``x``: plain PyTorch code."""
    h = torch.as_tensor(x)
    n = h.shape[0]
    seqs = [torch.tanh(shared.lin(h)), h * 0.5, torch.sin(h)]
    vecs = [shared.q * 1.0, h.sum(0), torch.cos(shared.q)]
    for step, (kind, a, b) in enumerate(program):
        if kind in ROW_KINDS and n == 0:
            continue
        if kind == "tanh":
            seqs[a] = torch.tanh(seqs[b])
        elif kind == "add":
            seqs[a] = seqs[a] + seqs[b]
        elif kind == "linear":
            seqs[a] = shared.lin(seqs[b]) * vecs[a]
        elif kind == "softmax_rows":
            seqs[a] = torch.softmax(seqs[b], 0) * seqs[a]
        elif kind == "sum_rows":
            vecs[a] = seqs[b].sum(0) + vecs[a]
        elif kind == "broadcast":
            seqs[a] = seqs[a] + vecs[b]
        elif kind == "scores":  # [L, d] @ [d]: a score per row
            # squashed: two raw scores in a row grew values to ~5,000, where loss_of's sin
            # turned rounding in the last place into gradients 1e-9 apart (eager's own
            # gradient moved 1e-8 when its inputs moved by 1e-15)
            seqs[a] = seqs[a] * torch.tanh(seqs[b] @ vecs[a]).unsqueeze(-1)
        elif kind == "attend":  # feed-forward attention over the rows
            vecs[a] = torch.softmax(seqs[b] @ vecs[b], 0) @ seqs[b]
        elif kind == "adjacency":  # [L, L] per instance, times the rows
            first = h[:, :1]
            seqs[a] = torch.sigmoid(first * first.t()) @ seqs[b]
        elif kind == "flip_cumsum":  # no ragged rule: batched by shape
            seqs[a] = seqs[b].flip(0).cumsum(0) * 0.5
        elif kind == "cat_features":
            seqs[a] = shared.mix(torch.cat([seqs[a], seqs[b]], -1))
        elif kind == "block":
            seqs[a] = shared.block(seqs[b])
        elif kind == "in_place":
            seqs[a] = seqs[a].clone()
            seqs[a].mul_(0.5).add_(seqs[b])
        elif kind == "no_grad":
            with torch.no_grad():
                target = shared.lin(seqs[b])
            seqs[a] = seqs[a] * target
        elif kind == "pick":  # a position that differs per instance, negative at times
            position = (7 * step + a) % n - (n if b % 2 else 0)
            vecs[a] = vecs[a] + seqs[b][position]
        elif kind == "last":
            vecs[a] = vecs[a] * seqs[b][-1]
        elif kind == "amax_rows":
            vecs[a] = seqs[b].amax(0) - vecs[a]
        elif kind == "gru":
            seqs[a] = shared.gru(seqs[b])[0]
        elif kind == "log_softmax_rows":
            seqs[a] = F.log_softmax(seqs[b], dim=0) + seqs[a]
        elif kind == "logsumexp_rows":
            vecs[a] = torch.logsumexp(seqs[b], 0) * vecs[b]
        elif kind == "cross_entropy_rows":  # a target per row, from the row's position
            target = torch.tensor([(i + step) % DIM for i in range(n)], dtype=torch.long)
            vecs[a] = vecs[a] + F.cross_entropy(seqs[b], target, reduction="sum")
        elif kind == "index_add":  # rows added into others by a per-instance index
            index = torch.tensor([(3 * i + a) % n for i in range(n)], dtype=torch.long)
            seqs[a] = seqs[a].index_add(0, index, seqs[b] * 2.0)
        elif kind == "column":
            seqs[a] = seqs[a] * seqs[b][:, b : b + 1]
        elif kind == "rotate_rows":
            seqs[a] = torch.cat([seqs[b][1:], seqs[b][:1]], 0)
        elif kind == "neighbours":  # slices along the rows, joined again: the same length
            seqs[a] = torch.cat([seqs[b][:1], seqs[b][1:] - seqs[b][:-1]], 0) + seqs[a]
        elif kind == "along_features":  # ops that keep each row to itself
            parts = torch.stack(seqs[a].chunk(DIM, -1), -1).sum(-1) * seqs[b].norm(
                dim=-1, keepdim=True
            )
            seqs[a] = F.normalize(seqs[b], dim=-1) + parts + seqs[b].cumsum(-1)
        elif kind == "detach":
            seqs[a] = seqs[a] * seqs[b].detach()
        elif kind == "branch_on_value":  # a value read: a sync point, then per-instance paths
            # away from 0, where a layer norm's rows sum to within rounding of either side
            if float(seqs[b].detach().sum()) > 0.37:
                seqs[a] = torch.sigmoid(seqs[a])
        elif kind == "set_row":
            seqs[a] = seqs[a].clone()
            seqs[a][0] = vecs[b]
        elif kind == "where_rows":
            seqs[a] = torch.where(seqs[b] > 0, seqs[a], 0.5 * seqs[b])
        elif kind == "masked_fill_rows":
            seqs[a] = seqs[a].masked_fill(seqs[b] < -0.5, 0.25)
        elif kind == "clamp_rows":
            seqs[a] = seqs[b].clamp(-1.0, 1.0) * seqs[a]
        elif kind == "sort_features":  # along each row's features: stable, so ties agree
            seqs[a] = torch.sort(seqs[b], dim=-1, stable=True).values + seqs[a]
        elif kind == "mean_rows":  # a reduction over the rows of any length
            vecs[a] = torch.tanh(seqs[b].mean(0, keepdim=True)).squeeze(0) + vecs[a] * 0.5
        elif kind == "max_rows":  # values and the row each came from
            values, rows = seqs[b].max(0)
            vecs[a] = vecs[a] + values * torch.cos(rows.to(values.dtype))
        elif kind == "square_source":  # a per-instance [L, L] given as it is: one packed source
            first = x[:, :1]
            seqs[a] = torch.as_tensor(torch.sigmoid(first * first.t())) @ seqs[b]
        elif kind == "square_rows":  # its rows read as rows, and the whole of it
            adjacency = torch.as_tensor(torch.cos(x[:, :1] - x[:, 1:2].t()))
            seqs[a] = torch.softmax(adjacency, -1) @ seqs[b] + adjacency.sum(1, keepdim=True)
            vecs[a] = vecs[a] + adjacency.abs().sum()
        elif kind == "pair_source":  # per-instance pair features [L, L, DIM]
            pairs = torch.as_tensor(torch.sin(x.unsqueeze(0) + 2 * x.unsqueeze(1)))
            seqs[a] = pairs.sum(1) * seqs[b] + pairs[:, :1].sum(1)
        elif kind == "argmax_pick":  # a position read from a value (a sync point), then picked
            # read from the input itself: computed values can tie to within rounding
            vecs[a] = vecs[a] + seqs[b][int(h[:, a].argmax())]
    return [*seqs, *vecs, shared.lin(vecs[0] + seqs[0].sum(0))]


instruction = st.tuples(
    st.sampled_from(KINDS), st.integers(0, REGISTERS - 1), st.integers(0, REGISTERS - 1)
)


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
@settings(max_examples=30, deadline=None)
@given(
    program=st.lists(instruction, min_size=1, max_size=10),
    lengths=st.lists(st.integers(0, 6), min_size=1, max_size=6),
    seed=st.integers(0, 2**16),
)
def test_random_programs_on_sequences_match_eager(
    scheduler: str, program: list[tuple[str, int, int]], lengths: list[int], seed: int
) -> None:
    torch.manual_seed(seed)
    shared = Shared()
    xs = [torch.randn(n, DIM) for n in lengths]
    assert_matches_eager(lambda x: run(program, x, shared), xs, shared, scheduler)  # type: ignore[arg-type]


def test_every_kind_runs_on_every_length() -> None:
    """The program of every kind once, on lengths 0 to 4: the fuzzer's ops all record."""
    torch.set_default_dtype(torch.float64)
    try:
        shared = Shared()
        program = [(kind, i % REGISTERS, (i + 1) % REGISTERS) for i, kind in enumerate(KINDS)]
        xs = [torch.randn(n, DIM) for n in (0, 1, 2, 3, 4, 3)]
        stats = assert_matches_eager(lambda x: run(program, x, shared), xs, shared, "agenda")
        assert stats.ragged_steps > 0
    finally:
        torch.set_default_dtype(torch.float32)


@pytest.mark.usefixtures("float64")
def test_an_ill_conditioned_program_is_held_to_eagers_own_rounding() -> None:
    """Found by the fuzzer: feature norms and running sums three times over grow a gradient to
    thousands, where batch_map and eager differ by 1.5e-10 of it. Eager's own gradient moves
    more than that when the weights move by a few units in the last place, so the oracle
    accepts it; a well-conditioned program's floor stays near rounding, so that acceptance
    is no wider than the program's conditioning."""
    program = [("along_features", 0, 0), ("add", 0, 0)] + [("along_features", 0, 0)] * 2
    torch.manual_seed(0)
    shared = Shared()
    xs = [torch.randn(n, DIM) for n in (0, 5)]
    assert_matches_eager(lambda x: run(program, x, shared), xs, shared, "depth")
    params = list(shared.parameters())
    ill = rounding_floor(lambda x: run(program, x, shared), xs, params)
    plain = rounding_floor(lambda x: run([("tanh", 0, 1)], x, shared), xs, params)
    assert max(ill) > 1e-7 and max(plain) < 1e-12


@pytest.mark.usefixtures("float64")
def test_a_square_source_read_flat_where_an_instance_has_no_rows() -> None:
    """Found by the fuzzer: with a length of 0 beside a length of 1, the product with the
    per-instance ``[L, L]`` read a chunk of no rows of the packed square source, and took the
    size of a row from its first row."""
    program = [("adjacency", 1, 0), ("gru", 0, 0), ("square_source", 0, 0)]
    torch.manual_seed(0)
    shared = Shared()
    xs = [torch.randn(n, DIM) for n in (0, 1)]
    for scheduler in ("agenda", "depth"):
        assert_matches_eager(lambda x: run(program, x, shared), xs, shared, scheduler)
