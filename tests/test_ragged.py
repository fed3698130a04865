"""Ragged steps equal eager per-instance execution: values and gradients, float64, lengths 0 up."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import batchfold as bf
from batchfold.schedule import Scheduler

DIM = 3
lin = torch.nn.Linear(2, DIM).double()
out = torch.nn.Linear(DIM, 2).double()
norm = torch.nn.LayerNorm(DIM).double()
emb = torch.nn.Embedding(7, DIM).double()
lstm = torch.nn.LSTM(DIM, 2, num_layers=2, bidirectional=True).double()
gru = torch.nn.GRU(DIM, 2).double()
h0 = torch.nn.Parameter(torch.randn(4, 2, dtype=torch.float64))  # an initial state, shared
PARAMS = [
    h0,
    *lin.parameters(),
    *out.parameters(),
    *norm.parameters(),
    emb.weight,
    *lstm.parameters(),
    *gru.parameters(),
]


def _h(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(lin(torch.as_tensor(x)))  # [L, DIM], per instance, with gradients


def _v(x: torch.Tensor) -> torch.Tensor:
    return out.weight[0] * torch.as_tensor(x).sum()  # [DIM], per instance, not ragged


# each case: per-instance code on a sequence x [L, 2]; "nonempty" cases need L >= 1
CASES: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], bool]] = {
    "elementwise": (lambda x: (_h(x) * 2 + 1).sigmoid() - _h(x), False),
    "broadcast a per-instance vector": (lambda x: _h(x) * _v(x) + _v(x).sum(), False),
    "0-d operand": (lambda x: _h(x) * torch.as_tensor(x).sum(), False),
    "linear and x @ W": (lambda x: out(_h(x)) + _h(x) @ out.weight.t(), False),
    "mv": (lambda x: _h(x) @ _v(x), False),
    "weighted sum": (lambda x: torch.softmax(_h(x)[:, 0], 0) @ _h(x), False),
    "layer_norm": (lambda x: norm(_h(x)), False),
    "embedding": (lambda x: emb(torch.as_tensor(x[:, 0]).abs().long() % 7) * _h(x), False),
    "softmax dims": (lambda x: F.log_softmax(_h(x), 0) + torch.softmax(_h(x), -1), False),
    "sum and mean over rows": (lambda x: _h(x).sum(0) + _h(x).mean(dim=0), False),
    "reductions over other dims": (lambda x: _h(x).sum(-1) + _h(x).amax(1), False),
    "max and logsumexp over rows": (lambda x: _h(x).amax(0) + _h(x).logsumexp(0), True),
    "cat, views, indexing": (
        lambda x: torch.cat([_h(x), _h(x)[:, :1]], -1).unsqueeze(1).transpose(1, 2)[..., 0],
        False,
    ),
    "unflatten and flatten away from the rows": (
        lambda x: (
            torch.cat([_h(x), 2 * _h(x)], -1).unflatten(-1, (2, -1)).sum(1)
            + torch.flatten(_h(x).unsqueeze(-1), 1)
            + _h(x).unsqueeze(1).flatten(start_dim=-2)
        ),
        False,
    ),
    "an op without a ragged rule between": (lambda x: _h(x).flip(0).cumsum(0) * _h(x), False),
    "along other dims": (
        lambda x: (
            F.normalize(_h(x), dim=-1)
            + _h(x).norm(dim=-1).unsqueeze(-1)
            + _h(x).cumsum(-1)
            + torch.stack([_h(x), _h(x) * 2], -1).sum(-1)
            + torch.cat(_h(x).split(1, -1)[::-1], -1)
            + torch.cat(_h(x).chunk(3, 1), -1)
            + _h(x).max(-1).values.unsqueeze(-1)
            + _h(x).argmax(-1).unsqueeze(-1).double()
        ),
        False,
    ),
    "variance along other dims": (lambda x: _h(x).var(-1, keepdim=True) * _h(x).std(1), True),
    "slices and cat along the rows": (
        lambda x: torch.cat([_h(x)[1:] - _h(x)[:-1], _h(x)[-2:], _h(x)[:1] * 3], 0).exp(),
        False,
    ),
    "the same row and per-instance rows": (
        lambda x: _h(x)[-1] * _h(x)[0] + _h(x)[len(x) // 2],
        True,
    ),
    "recurrent layers on whole sequences": (
        lambda x: lstm(_h(x))[0].sum(0) + gru(_h(x))[1].sum() + lstm(_h(x))[1][1].sum(),
        True,
    ),
    "recurrent layers from initial states from outside or mixed": (
        lambda x: (
            lstm(_h(x), (h0, torch.zeros(4, 2, dtype=torch.float64)))[0].sum(0)
            + gru(_h(x), h0[:1])[1].sum()
            + lstm(_h(x), (h0, _h(x).mean(0)[:2].expand(4, 2)))[1][0].sum()
        ),
        True,
    ),
    "rows picked and summed by a per-instance index": (lambda x: _pair_sum(x), True),
    "sum and mean of every element": (lambda x: _h(x).sum() + _h(x)[:, 0].mean(), False),
    "adjacency times states": (
        lambda x: (_adjacency(x) @ _h(x)) * (_adjacency(x) @ _h(x)[:, 1]).unsqueeze(-1),
        False,
    ),
}


def _index(x: torch.Tensor, shift: int) -> torch.Tensor:
    """A per-instance int64 index into x's rows, of another length (2L + 1), some negative."""
    n = len(x)
    return torch.as_tensor(
        [(i * 5 + shift) % n - (n if i % 3 == 0 else 0) for i in range(2 * n + 1)]
    )


def _pair_sum(x: torch.Tensor) -> torch.Tensor:
    per_pair = _h(x)[_index(x, 1)] * _h(x).index_select(0, _index(x, 2) % len(x))
    total = torch.zeros(len(x), DIM, dtype=torch.float64)
    total.index_add_(0, _index(x, 3) % len(x), per_pair)
    return total + _h(x)


def _adjacency(x: torch.Tensor) -> torch.Tensor:
    a = torch.as_tensor(x)[:, :1]  # [L, 1]
    return torch.sigmoid(a * a.t())  # [L, L] per instance


def _batch(nonempty: bool, seed: int) -> list[torch.Tensor]:
    rng = random.Random(seed)
    lengths = [0, 1, 1, 4, 2, 7, 3, 4] if not nonempty else [1, 1, 4, 2, 7, 3, 4]
    rng.shuffle(lengths)
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(n, 2, dtype=torch.float64, generator=gen) * 3 for n in lengths]


def _grads(outputs: list[torch.Tensor]) -> list[torch.Tensor | None]:
    total = sum((o * (i + 1)).sum() for i, o in enumerate(outputs))
    assert isinstance(total, torch.Tensor)
    return list(torch.autograd.grad(total, PARAMS, allow_unused=True))


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_ragged_steps_equal_eager(case: str, scheduler: Scheduler) -> None:
    fn, nonempty = CASES[case]
    xs = _batch(nonempty, seed=len(case))
    got, stats = bf.batch_map(fn, xs, scheduler=scheduler, return_stats=True)
    want = [fn(x) for x in xs]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, equal_nan=True)
    for g, w in zip(_grads(got), _grads(want), strict=True):
        assert (g is None) == (w is None)
        if g is not None:
            torch.testing.assert_close(g, w)
    assert stats.ragged_steps > 0 and stats.plan is not None
    names = [
        s.sig.name
        for s in stats.plan.steps
        if s.sig.name in ("linear", "Linear") and s.sig.in_metas[0].shape[1:] == (2,)
    ]
    # lin: every length in one step, however many lengths (its calls traced op by op, if
    # any, in one step of the op; its cached calls in one step of the module)
    assert names and len(names) == len(set(names))


def test_ragged_off_batches_by_shape_and_gives_the_same_values() -> None:
    fn = CASES["weighted sum"][0]
    xs = _batch(False, seed=1)
    on, with_ragged = bf.batch_map(fn, xs, return_stats=True)
    off, without = bf.batch_map(fn, xs, return_stats=True, ragged=False)
    for a, b in zip(on, off, strict=True):
        torch.testing.assert_close(a, b)
    assert without.ragged_steps == 0 and with_ragged.ragged_steps > 0
    assert with_ragged.steps < without.steps


def test_dropout_on_packed_rows_draws_per_instance() -> None:
    xs = [torch.ones(n, 50, dtype=torch.float64) for n in (3, 4, 3, 5)]
    got = bf.batch_map(lambda x: F.dropout(torch.as_tensor(x), 0.5, training=True), xs)
    assert [tuple(g.shape) for g in got] == [(3, 50), (4, 50), (3, 50), (5, 50)]
    assert set(torch.cat(got).unique().tolist()) == {0.0, 2.0}
    assert not torch.equal(got[0], got[2])  # same length, drawn apart


def test_a_module_on_sequences_is_one_cached_call_and_batches_across_lengths() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.Tanh()).double()
    xs = _batch(False, seed=2)
    got, stats = bf.batch_map(lambda x: model(torch.as_tensor(x)).sum(0), xs, return_stats=True)
    for g, x in zip(got, xs, strict=True):
        torch.testing.assert_close(g, model(x).sum(0))
    assert stats.plan is not None
    names = [s.sig.name for s in stats.plan.steps]
    # the calls traced to confirm the cache ran op by op, in steps of their own
    assert names.count("Sequential") == 1 and "linear" in names
    # an empty sequence after them takes the cached call too: its sum over no rows is zeros
    assert [len(x) for x in xs].index(0) > 2 and not stats.module_misses
    assert stats.module_calls_cached == len(xs) - 2


def test_an_index_out_of_an_instances_range_is_refused_not_read_from_another() -> None:
    xs = [torch.randn(n, 2, dtype=torch.float64) for n in (3, 5, 2)]

    def pick(x: torch.Tensor) -> torch.Tensor:
        return _h(x)[torch.as_tensor([0, 4])]  # row 4: in range for the second only

    with pytest.raises(IndexError):
        pick(xs[0])
    with pytest.raises(IndexError, match="out of range"):
        bf.batch_map(pick, xs)


def test_a_position_out_of_an_instances_range_raises_an_index_error_as_eagerly() -> None:
    # a ShapeError alone (a ValueError): code that caught IndexError took another way
    xs = [torch.randn(n, 2, dtype=torch.float64) for n in (4, 6, 2)]

    def fn(x: torch.Tensor) -> torch.Tensor:
        h = _h(x)
        try:
            return h[3]  # out of range for the instance of 2 rows
        except IndexError:
            return h.sum(0)

    for got, x in zip(bf.batch_map(fn, xs), xs, strict=True):
        torch.testing.assert_close(got, fn(x))


def test_greedy_decoding_with_attention_gives_the_tokens_of_one_at_a_time() -> None:
    torch.manual_seed(3)
    embed = torch.nn.Embedding(12, 6).double()
    encoder = torch.nn.GRU(6, 6).double()
    cell = torch.nn.GRUCell(6, 6).double()
    head = torch.nn.Linear(12, 12).double()

    def decode(tokens: list[int]) -> list[int]:
        states, last = encoder(embed(torch.tensor(tokens)))
        h, token, out = last[0], tokens[-1], []
        while len(out) < 8:
            h = cell(embed(torch.tensor(token)), h)
            context = torch.softmax(states @ h, 0) @ states  # over this sequence's length
            token = int(head(torch.cat([h, context])).argmax())  # a sync point
            out.append(token)
            if token == 0:
                break
        return out

    rng = random.Random(5)
    sources = [[rng.randrange(1, 12) for _ in range(rng.randint(1, 9))] for _ in range(12)]
    with torch.no_grad():
        want = [decode(s) for s in sources]
        for scheduler in ("agenda", "depth"):
            got, stats = bf.batch_map(decode, sources, scheduler=scheduler, return_stats=True)
            assert got == want
            assert stats.syncs == max(map(len, want)) and stats.ragged_steps > 0


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_training_on_greedy_predictions_equals_eager(scheduler: Scheduler) -> None:
    # the summed log-likelihood of a per-instance target under greedy decoding: a pick of
    # the gold token per step (one batched pick), sync points, ragged attention
    torch.manual_seed(4)
    embed = torch.nn.Embedding(12, 6).double()
    cell = torch.nn.GRUCell(6, 6).double()
    head = torch.nn.Linear(12, 12).double()
    params = [*embed.parameters(), *cell.parameters(), *head.parameters()]

    def loss(tokens: list[int]) -> torch.Tensor:
        states = torch.tanh(embed(torch.tensor(tokens)))
        h, token, score, steps = states[-1], tokens[-1], torch.zeros(()), 0
        while steps < 6:
            h = cell(embed(torch.tensor(token)), h)
            logits = head(torch.cat([h, torch.softmax(states @ h, 0) @ states]))
            if steps < len(tokens):
                score = score - torch.log_softmax(logits, 0)[tokens[::-1][steps]]
            token, steps = int(logits.argmax()), steps + 1
            if token == 0:
                break
        return score

    rng = random.Random(6)
    sources = [[rng.randrange(1, 12) for _ in range(rng.randint(1, 9))] for _ in range(10)]
    want = [loss(s) for s in sources]
    got, stats = bf.batch_map(loss, sources, scheduler=scheduler, return_stats=True)
    torch.testing.assert_close(torch.stack(got), torch.stack(want))
    grads = torch.autograd.grad(torch.stack(got).sum(), params)
    for g, e in zip(grads, torch.autograd.grad(torch.stack(want).sum(), params), strict=True):
        torch.testing.assert_close(g, e)
    assert stats.syncs > 1 and stats.ragged_steps > 0


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_cross_entropy_over_rows(reduction: str) -> None:
    xs = _batch(True, seed=4)

    def loss(x: torch.Tensor) -> torch.Tensor:
        target = torch.as_tensor([i % 2 - (i % 5 == 3) * 101 for i in range(len(x))])  # some -100
        return F.cross_entropy(out(_h(x)), target, reduction=reduction)

    got, stats = bf.batch_map(loss, xs, return_stats=True)
    want = [loss(x) for x in xs]
    torch.testing.assert_close(torch.stack(got), torch.stack(want), equal_nan=True)
    for g, w in zip(_grads(got), _grads(want), strict=True):
        if g is not None and w is not None:
            torch.testing.assert_close(g, w)
    assert not stats.fallbacks and stats.ragged_steps > 0


def test_graphs_of_several_lengths_pass_the_graph_lint(monkeypatch: pytest.MonkeyPatch) -> None:
    from batchfold.lazy.recorder import Recorder

    flush = Recorder.flush
    linted = []

    def lint_then_flush(self: Recorder, *args: Any) -> None:
        self.graph.lint()  # every node's own signature, in its family's shared buffer
        linted.append(any(p.members for p in self.graph.pending_of))
        flush(self, *args)

    monkeypatch.setattr(Recorder, "flush", lint_then_flush)
    for fn, nonempty in CASES.values():
        bf.batch_map(fn, _batch(nonempty, seed=1))
    assert any(linted)


def test_a_shared_tensor_that_fixes_the_length_is_refused_at_every_new_length() -> None:
    side = torch.zeros(3, 1, dtype=torch.float64)  # fits sequences of 3 rows only

    def join(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([_h(x), side], -1)

    xs = [torch.randn(3, 2, dtype=torch.float64), torch.randn(3, 2, dtype=torch.float64)]
    torch.testing.assert_close(
        torch.stack(bf.batch_map(join, xs)), torch.stack([join(x) for x in xs])
    )
    with pytest.raises(RuntimeError):
        join(torch.randn(4, 2, dtype=torch.float64))
    with pytest.raises(bf.ShapeError, match="cat"):  # not skipped as a known family's length
        bf.batch_map(join, [*xs, torch.randn(4, 2, dtype=torch.float64)])


def _many_readers(x: torch.Tensor) -> torch.Tensor:
    h = _h(x)  # one packed value, read by ops of every kind below
    rows = out(h) * h[:, :2]  # row-wise
    pooled = h.sum(0) + h.amax(0)  # reductions over the rows
    picked = h[_index(x, 1)].sum(0)  # rows picked by a per-instance index
    fallback = h.flip(0).cumsum(0)[-1]  # ops without a ragged rule, grouped by shape
    return rows.sum(0).sum() + pooled + picked + fallback


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_a_packed_value_with_many_readers_is_handed_out_once(scheduler: Scheduler) -> None:
    xs = _batch(True, seed=5)
    got, stats = bf.batch_map(_many_readers, xs, scheduler=scheduler, return_stats=True)
    want = [_many_readers(x) for x in xs]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    for g, w in zip(_grads(got), _grads(want), strict=True):
        assert (g is None) == (w is None)
        if g is not None:
            torch.testing.assert_close(g, w)
    assert stats.plan is not None
    (tanh,) = [s for s in stats.plan.steps if s.sig.name == "tanh"]
    assert tanh.lengths is not None and len(tanh.fanouts) == 1  # packed, and fanned out
    assert len(tanh.fanouts[0].sizes) >= 4  # one chunk per reading step


def _readers_in_two_grad_modes(x: torch.Tensor) -> torch.Tensor:
    h = _h(x)
    with torch.no_grad():  # readers of the same packed value that must not carry gradients
        frozen = h.sum(0) + (h * 2).amax(0)
    return h.sum(0) * frozen + h.mean(0)


def test_packed_fanout_readers_keep_their_grad_mode() -> None:
    xs = _batch(True, seed=9)
    got = bf.batch_map(_readers_in_two_grad_modes, xs)
    want = [_readers_in_two_grad_modes(x) for x in xs]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    for g, w in zip(_grads(got), _grads(want), strict=True):
        assert (g is None) == (w is None)
        if g is not None:
            torch.testing.assert_close(g, w)


@pytest.mark.parametrize(
    ("lengths", "padded"), [([3, 4, 0, 4, 1, 5, 4], True), ([1] * 12 + [20, 0], False)]
)
def test_block_diagonal_products_padded_or_by_entries_equal_eager(
    lengths: list[int], padded: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per-instance ``[L, L] @ [L, d]`` runs as one padded ``bmm`` unless one instance is far
    longer than the rest (then row by row of each block); both give eager's values and grads."""
    bmm_calls = []
    real_bmm = torch.bmm
    monkeypatch.setattr(torch, "bmm", lambda *a: bmm_calls.append(1) or real_bmm(*a))
    gen = torch.Generator().manual_seed(len(lengths))
    xs = [torch.randn(n, 2, dtype=torch.float64, generator=gen) for n in lengths]

    def fn(x: torch.Tensor) -> torch.Tensor:
        a = _adjacency(x) + _h(x)[:, 1:2]  # not symmetric; with gradients into the blocks
        return torch.cat([(a @ _h(x)).flatten(), _adjacency(x * 2) @ _h(x)[:, 0]])

    got = bf.batch_map(fn, xs)
    assert bool(bmm_calls) == padded
    want = [fn(x) for x in xs]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    for g, w in zip(_grads(got), _grads(want), strict=True):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int32, torch.uint8])
def test_products_of_instances_keep_eagers_dtype_and_rounding(dtype: torch.dtype) -> None:
    # half precision: products added up in float32 and rounded once, as eager's matmul does
    # (they were rounded one by one); int32: it came back int64 (a rule's crash)
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(n, 8, generator=gen, dtype=torch.float64) * 3 for n in (3, 17, 1, 25)]

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = torch.as_tensor(x).to(dtype)
        return h @ h[0], h[:, 0] @ h, (h @ h.T) @ h  # mv, weighted rows, block diagonal

    for got, want in zip(bf.batch_map(fn, xs), [fn(x) for x in xs], strict=True):
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and torch.equal(g, w)


def test_a_product_of_bool_instances_raises_as_eagerly() -> None:
    xs = [torch.rand(n, 4) > 0.5 for n in (2, 3)]
    fn = lambda x: torch.as_tensor(x)[:, 0] @ torch.as_tensor(x)  # noqa: E731
    with pytest.raises(NotImplementedError):
        fn(xs[0])
    with pytest.raises(NotImplementedError, match="bool"):
        bf.batch_map(fn, xs)


def test_iterating_over_rows_of_an_instance_with_none_gives_nothing() -> None:
    """Eagerly ``[f(r) for r in h]`` over 0 rows is an empty list; it was refused, as the
    unbind of no rows returns no tensor."""
    layer = nn.Linear(3, 3)

    def fn(x: Any) -> Any:
        return [layer(r) for r in torch.as_tensor(x)]

    xs = [torch.randn(2, 3), torch.randn(0, 3), torch.randn(1, 3)]
    got, want = bf.batch_map(fn, xs), [fn(x) for x in xs]
    assert [len(g) for g in got] == [2, 0, 1]
    for g, w in zip(got, want, strict=True):
        for a, b in zip(g, w, strict=True):
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize(
    "reduce",
    [
        lambda x: torch.softmax(x, 0),
        lambda x: torch.log_softmax(x, 0),
        lambda x: torch.logsumexp(x, 0),
        lambda x: x.amax(0),
    ],
    ids=["softmax", "log_softmax", "logsumexp", "amax"],
)
def test_reductions_over_rows_with_infinities_and_nans_give_eagers_values(
    reduce: Callable[[torch.Tensor], torch.Tensor],
) -> None:
    """A column holding +inf made every entry of an eager softmax NaN, where the batched one
    shifted by 0 and gave 0 beside the NaN (and log_softmax -inf)."""
    inf, nan = float("inf"), float("nan")
    xs = [  # columns: +inf among finite, all -inf, +inf and -inf, a NaN, finite
        torch.tensor([[inf, -inf, inf, 1.0, 1.0], [1.0, -inf, -inf, nan, 2.0]]),
        torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0], [2.0, 3.0, 4.0, 5.0, 6.0], [0, 0, 0, 0, 0]]),
        torch.tensor([[inf, -inf, -inf, nan, -1.0]]),
    ]
    xs = [x.double() for x in xs]

    def fn(x: torch.Tensor) -> torch.Tensor:
        return reduce(torch.as_tensor(x))

    for got, x in zip(bf.batch_map(fn, xs), xs, strict=True):
        torch.testing.assert_close(got, fn(x), equal_nan=True)


def test_a_negative_index_counts_from_the_end_in_indexing_and_is_refused_by_index_select() -> None:
    """Eager ``x[i]`` reads row -1 as the last; ``index_select`` refuses it. The packed step
    read it as the last row for both."""
    xs = [torch.randn(n, 2, dtype=torch.float64) for n in (3, 5, 2)]

    def indexed(x: torch.Tensor) -> torch.Tensor:
        return _h(x)[torch.as_tensor([-1, 0])]

    for got, x in zip(bf.batch_map(indexed, xs), xs, strict=True):
        torch.testing.assert_close(got, indexed(x))
    for select in (
        lambda x: _h(x).index_select(0, torch.as_tensor([-1, 0])),
        lambda x: torch.index_select(_h(x), 0, torch.as_tensor([0, -2])),
    ):
        with pytest.raises(IndexError):
            select(xs[0])
        with pytest.raises(IndexError, match="out of range"):
            bf.batch_map(select, xs)


def test_transposes_that_name_the_rows_by_keyword_move_them() -> None:
    """``x.transpose(1, dim1=0)`` moves the rows; read as leaving them alone (only ``dim`` and
    ``dim0`` were looked at), its packed step failed its shape check where the first
    instance is square."""
    xs = [torch.randn(n, 2, dtype=torch.float64) for n in (DIM, 5, 2, 1)]
    fns = (
        lambda x: _h(x).transpose(1, dim1=0).sum(-1),
        lambda x: torch.transpose(_h(x), dim0=1, dim1=0).sum(-1),
        lambda x: torch.swapaxes(_h(x), axis0=0, axis1=1).sum(-1),
        lambda x: _h(x).unsqueeze(dim=-1).transpose(dim0=1, dim1=2).squeeze(dim=1),
    )
    for fn in fns:
        for got, x in zip(bf.batch_map(fn, xs), xs, strict=True):
            torch.testing.assert_close(got, fn(x))


def test_unbinding_a_sequence_of_no_rows_gives_nothing_as_eagerly() -> None:
    """``x.unbind(0)`` (and ``list(x)``) of 0 rows is ``()`` eagerly; it was refused as an op
    returning no tensor."""
    xs = [torch.randn(2, 3, dtype=torch.float64), torch.randn(0, 3, dtype=torch.float64)]

    def fn(x: torch.Tensor) -> Any:
        t = torch.as_tensor(x)
        return [r * 2 for r in t.unbind(0)], [r + 1 for r in t], torch.unbind(t, dim=0)

    got = bf.batch_map(fn, xs)
    for g, w in zip(got, [fn(x) for x in xs], strict=True):
        assert [len(part) for part in g] == [len(part) for part in w]
        for a, b in zip(
            [t for part in g for t in part], [t for part in w for t in part], strict=True
        ):
            torch.testing.assert_close(a, b)
