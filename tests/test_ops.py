"""Every batching rule against eager execution; ops without a rule run through vmap or a loop.

How the executor counts those fallbacks is tested in test_execute.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import batchfold as bf
from batchfold.schedule import Scheduler
from reference import assert_matches_eager

pytestmark = pytest.mark.usefixtures("float64")


class Shared(nn.Module):
    """Parameters the per-instance code shares; gradients are checked for each of them."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 3))
        self.v = nn.Parameter(torch.randn(3))
        self.lin = nn.Linear(3, 5)
        self.emb = nn.Embedding(10, 3)
        self.norm = nn.LayerNorm(3)
        self.lstm = nn.LSTMCell(3, 2)
        self.gru = nn.GRUCell(3, 2)


S = Shared().double()
Op = Callable[[torch.Tensor], Any]

# each op takes x: [4, 3] per instance, a shared-parameter product so gradients flow
OPS: dict[str, Op] = {
    "tanh": torch.tanh,
    "sigmoid-method": lambda x: x.sigmoid(),
    "relu": F.relu,
    "gelu": F.gelu,
    "leaky_relu": lambda x: F.leaky_relu(x, 0.1),
    "exp-log": lambda x: torch.log(x.exp() + 1),
    "sqrt-abs": lambda x: (x.abs() + 0.1).sqrt(),
    "add-shared-row": lambda x: x + S.v,
    "radd-scalar": lambda x: 2.0 + x,
    "rsub": lambda x: 1 - x,
    "mul-shared-matrix": lambda x: x * S.w,
    "div": lambda x: x / (x.abs() + 1),
    "pow": lambda x: x**2,
    "where-compare": lambda x: torch.where(x > 0, x, S.v * 2),
    "masked_fill-number": lambda x: x.masked_fill(x > 0, 0.5),
    "masked_fill-shared-value": lambda x: x.masked_fill(x > 0, S.v[0]),
    # a per-instance 0-d value: the rowwise rule would give masked_fill a [n, 1, 1] value
    "masked_fill-instance-value": lambda x: x.masked_fill(x > 0, x[0, 0] * 2),
    "clamp": lambda x: x.clamp(-0.5, 0.5),
    "maximum": lambda x: torch.maximum(x, S.v),
    "dropout-eval": lambda x: F.dropout(x, 0.5, training=False),
    "broadcast-lazy-lazy": lambda x: x + x[0],
    "linear": S.lin,
    "linear-row": lambda x: S.lin(x[1]),
    "layer_norm": S.norm,
    "matmul-left": lambda x: x @ S.w.t(),
    "matmul-right": lambda x: S.w.t() @ x,
    "matmul-vector-right": lambda x: S.w @ x[0],
    "mm": lambda x: torch.mm(x, S.w.t()),
    "mv": lambda x: torch.mv(x, S.v),
    "matmul-lazy-lazy": lambda x: x @ x.t(),
    "embedding": lambda x: S.emb(torch.tensor([1, 3, 3])) + x[0],
    "lstm_cell": lambda x: S.lstm(x[0], (x[1, :2], x[2, :2]))[0],
    "gru_cell": lambda x: S.gru(x[0], x[1, :2]),
    "chunk": lambda x: x.chunk(2, dim=0)[1] * 2,
    "split": lambda x: torch.split(x, [1, 2], dim=1)[1],
    "unbind": lambda x: x.unbind(1)[2],
    "iterate": lambda x: sum(row for row in x),
    "softmax": lambda x: F.softmax(x, dim=-1),
    "log_softmax": lambda x: torch.log_softmax(x, 0),
    "cumsum": lambda x: x.cumsum(dim=1),
    "logsumexp": lambda x: torch.logsumexp(x, dim=(0, 1)),
    "sum-dim-keepdim": lambda x: x.sum(dim=0, keepdim=True),
    "sum-all": lambda x: x.sum(),
    "mean-neg-dim": lambda x: x.mean(-1),
    "amax": lambda x: torch.amax(x, dim=1),
    "max-dim": lambda x: x.max(dim=0).values + x.max(dim=0)[1].double(),
    "max-all": lambda x: x.max(),
    "argmax-all": lambda x: x * x.argmax(),
    "argmin-dim-keepdim": lambda x: x * torch.argmin(x, dim=1, keepdim=True),
    "min-dim-tuple": lambda x: x.min(1)[0],
    "any-all-compare": lambda x: x * (x > 0.5).any(),
    "mean-all-dtype": lambda x: x.mean(dtype=torch.float64),
    "cat-shared": lambda x: torch.cat([x, S.w, x], dim=-1),
    "cat-dim0": lambda x: torch.cat([x[:2], x], 0),
    "stack": lambda x: torch.stack([x[0], S.v, x[1]], dim=1),
    "getitem-int": lambda x: x[2],
    "getitem-slices": lambda x: x[1:3, ::2],
    "getitem-ellipsis-none": lambda x: x[..., None, 1],
    "getitem-negative": lambda x: x[-1, -2:],
    "getitem-tensor-index": lambda x: x[torch.tensor([0, 2, 2])],
    "setitem": lambda x: _setitem(x),
    "reshape": lambda x: x.reshape(2, 6),
    "view-infer": lambda x: x.view(-1),
    "flatten": lambda x: torch.flatten(x[None]),
    "squeeze-unsqueeze": lambda x: x.unsqueeze(1).squeeze(1).unsqueeze(-1),
    "expand": lambda x: x[0].expand(5, 3),
    "broadcast_to": lambda x: torch.broadcast_to(x[1], (2, 3)),
    "transpose": lambda x: x.transpose(0, 1),
    "t": lambda x: x.t(),
    "T-property": lambda x: x.T,
    "permute": lambda x: x[None].permute(2, 0, 1),
    "cross_entropy": lambda x: F.cross_entropy(x, torch.tensor([0, 2, 1, 1])),
    "cross_entropy-rows-ignored-sum": lambda x: F.cross_entropy(
        x, torch.tensor([0, -100, 2, 1]), reduction="sum"
    ),
    "cross_entropy-rows-ignored-mean": lambda x: F.cross_entropy(
        x[1:], torch.tensor([2, 0, 2]), ignore_index=2
    ),
    "cross_entropy-one-sample": lambda x: F.cross_entropy(x[1], torch.tensor(2)),
    "cross_entropy-sum-smoothing": lambda x: F.cross_entropy(
        x[0], torch.tensor(1), reduction="sum", label_smoothing=0.1
    ),
    "cross_entropy-ignored-sum": lambda x: F.cross_entropy(
        x[0], torch.tensor(1), ignore_index=1, reduction="sum"
    ),
    "norm": lambda x: torch.linalg.vector_norm(x, dim=1),
    "sort": lambda x: torch.sort(x, dim=1).values,
    "to-dtype": lambda x: x.to(torch.float32).double(),
    "zeros_like-ones": lambda x: x + torch.ones(3) + torch.zeros_like(x),
    "in-place": lambda x: x.clone().mul_(3).add_(1),
}


def _setitem(x: torch.Tensor) -> torch.Tensor:
    y = x * 1
    y[0, 1:] = y[1, :2] * 2
    return y


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
@pytest.mark.parametrize("name", sorted(OPS))
def test_op_matches_eager(name: str, scheduler: Scheduler) -> None:
    op = OPS[name]
    inputs = [torch.randn(4, 3).tolist() for _ in range(5)]
    assert_matches_eager(lambda x: op(torch.tensor(x) * S.w), inputs, S, scheduler)


def test_reductions_over_all_or_some_dims_have_a_rule() -> None:
    inputs = [torch.randn(4, 3).tolist() for _ in range(5)]
    for name in ("sum-all", "max-all", "argmax-all", "min-dim-tuple", "any-all-compare"):
        _, stats = bf.batch_map(
            lambda x, n=name: OPS[n](torch.tensor(x)), inputs, return_stats=True
        )
        assert stats.fallbacks == {}, name


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_reductions_over_an_empty_list_of_dims_reduce_every_dim_of_an_instance(
    scheduler: Scheduler,
) -> None:
    """``x.sum(dim=[])`` reduces every dim eagerly; shifted to the batch it would reduce the
    batch's dim too (it crashed): it falls back, with eager's values."""
    inputs = [torch.randn(4, 3).tolist() for _ in range(3)]
    for reduce in (
        lambda x: x.sum(dim=[]),
        lambda x: x.mean(dim=()),
        lambda x: x.amax(dim=[], keepdim=True),
        lambda x: x[0, 0].sum(dim=[]),  # 0-d
    ):
        assert_matches_eager(lambda x, f=reduce: f(torch.tensor(x) * S.w), inputs, S, scheduler)


def test_one_sample_cross_entropy_is_batched_and_nan_when_ignored_under_mean() -> None:
    labels = [0, 1, 2]
    fn = lambda y: F.cross_entropy(torch.tensor([0.5, 1.0, -1.0]), torch.tensor(y), ignore_index=1)  # noqa: E731
    out, stats = bf.batch_map(fn, labels, return_stats=True)
    assert stats.fallbacks == {}
    assert out[1].isnan() and not out[0].isnan()
    torch.testing.assert_close(out[2], fn(2))


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cross_entropy_over_rows_is_batched_without_vmap(reduction: str) -> None:
    """Per-instance logits ``[N, C]`` of equal shapes: one batched call, eager's values and
    gradients; rows all ignored give nan under ``"mean"`` and 0 under ``"sum"``, as eagerly."""
    w = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    targets = [[0, 3, -100], [-100, -100, -100], [1, 1, 2], [3, -100, 0]]

    def fn(target: list[int]) -> torch.Tensor:
        logits = torch.tensor([[0.5, 1.0, -1.0]] * 3, dtype=torch.float64) * (1 + len(target))
        return F.cross_entropy(logits.cumsum(0) @ w, torch.tensor(target), reduction=reduction)

    out, stats = bf.batch_map(fn, targets, return_stats=True)
    eager = [fn(t) for t in targets]
    assert stats.fallbacks == {}
    torch.testing.assert_close(torch.stack(out), torch.stack(eager), equal_nan=True)
    assert out[1].isnan() == (reduction == "mean")
    kept = [0, 2, 3]
    got = torch.autograd.grad(torch.stack([out[i] for i in kept]).sum(), w)
    want = torch.autograd.grad(torch.stack([eager[i] for i in kept]).sum(), w)
    torch.testing.assert_close(got, want)


# One op per rule family: the function it calls (its row of RULES) and per-instance code that
# calls it on x: [4, 3], with no nn.Module call (a cached module call would hide the op).
FAMILY_CASES: list[tuple[Any, Op]] = [
    (torch.tanh, torch.tanh),
    (torch.Tensor.masked_fill, lambda x: x.masked_fill(x > 0, 0.5)),
    # the forms batch_map records for normalisation in training mode (lazy/running_stats.py)
    (F.batch_norm, lambda x: F.batch_norm(x, None, None, S.v, S.v * 2, True, 0.0, 1e-5)),
    (F.instance_norm, lambda x: F.instance_norm(x[None], None, None, None, None, True, 0.0, 1e-5)),
    (F.linear, lambda x: F.linear(x, S.lin.weight, S.lin.bias)),
    (F.embedding, lambda x: S.emb(torch.tensor([1, 3, 3])) + x[0]),
    (torch.matmul, lambda x: torch.matmul(x, S.w.t())),
    (
        torch.gru_cell,
        lambda x: torch.gru_cell(
            x[:1], x[1:2, :2], S.gru.weight_ih, S.gru.weight_hh, S.gru.bias_ih, S.gru.bias_hh
        ),
    ),
    (torch.Tensor.chunk, lambda x: x.chunk(2, dim=0)[1]),
    (torch.Tensor.unbind, lambda x: x.unbind(1)[2]),
    (F.softmax, lambda x: F.softmax(x, dim=-1)),
    (torch.Tensor.cumsum, lambda x: x.cumsum(dim=1)),
    (torch.Tensor.sum, lambda x: x.sum(dim=0)),
    (torch.cat, lambda x: torch.cat([x, S.w], dim=-1)),
    (torch.stack, lambda x: torch.stack([x[0], S.v, x[1]], dim=1)),
    (torch.Tensor.__getitem__, lambda x: x[1:3, ::2]),
    (torch.Tensor.reshape, lambda x: x.reshape(2, 6)),
    (torch.Tensor.expand, lambda x: x[0].expand(5, 3)),
    (torch.Tensor.t, lambda x: x.t()),
    (F.cross_entropy, lambda x: F.cross_entropy(x[1], torch.tensor(2))),
]


def _family_id(rule: bf.OpRule) -> str:
    funcs = [f for f, r in bf.RULES.items() if r is rule]
    return f"{rule.name}:{getattr(funcs[0], '__name__', funcs[0])}"


# distinct rules; not the ops run once per instance on purpose (one_hot checks each index)
FAMILIES = [r for r in {id(r): r for r in bf.RULES.values()}.values() if r.name != "loop"]


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
@pytest.mark.parametrize("rule", FAMILIES, ids=_family_id)
def test_every_registered_family_is_exercised(rule: bf.OpRule, scheduler: Scheduler) -> None:
    """Each distinct rule in RULES batches a case equal to eager, without vmap or a loop."""
    cases = [fn for func, fn in FAMILY_CASES if bf.RULES.get(func) is rule]
    funcs = sorted({str(getattr(f, "__name__", f)) for f, r in bf.RULES.items() if r is rule})
    assert cases, f"no case in FAMILY_CASES exercises rule {rule.name!r} (of {funcs[:8]}, ...)"
    inputs = [torch.randn(4, 3).tolist() for _ in range(5)]
    for fn in cases:
        stats = assert_matches_eager(
            lambda x, fn=fn: fn(torch.tensor(x) * S.w), inputs, S, scheduler
        )
        assert stats.plan is not None and stats.fallbacks == {}, f"fell back: {stats.fallbacks}"
        used = [step.sig.rule for step in stats.plan.steps]
        assert any(r is rule for r in used), f"{rule.name!r} not used: {[r.name for r in used]}"


def test_every_family_case_names_a_registered_function() -> None:
    for func, _ in FAMILY_CASES:
        assert func in bf.RULES, f"{func} has no row in RULES"


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_masked_fill_with_a_per_instance_value_batches_without_vmap(scheduler: Scheduler) -> None:
    """``masked_fill`` takes 0-d values only, so a per-instance one (``h.sum()``) went through
    vmap; it is ``torch.where`` of the value cast to ``x``'s dtype."""
    torch.manual_seed(0)
    layer = nn.Linear(4, 4).double()

    def fn(x: list[float]) -> torch.Tensor:
        h = layer(torch.tensor(x, dtype=torch.float64))
        return h.masked_fill(h > 0, h.sum().float()) * h.masked_fill(mask=h < 0, value=h[1])

    xs = [torch.randn(4).tolist() for _ in range(5)]
    stats = assert_matches_eager(fn, xs, layer, scheduler)
    assert not stats.fallbacks


def _promoted(a: torch.dtype, b: torch.dtype) -> Callable[[Any], torch.Tensor]:
    def fn(x: Any) -> torch.Tensor:
        t = torch.as_tensor(x)
        return (t * 1).to(a) + t.sum().to(b)  # a per-instance 0-d value of dtype b

    return fn


@pytest.mark.parametrize(
    ("dims", "zero"),
    [
        (torch.float32, torch.complex128),  # eager: complex64
        (torch.bfloat16, torch.complex128),  # complex64
        (torch.int64, torch.float64),  # float64
        (torch.complex64, torch.complex128),  # complex64
        (torch.float32, torch.float64),  # float32
        (torch.bool, torch.int32),  # int32
    ],
)
def test_a_per_instance_0d_value_of_a_wider_category_promotes_as_eagerly(
    dims: torch.dtype, zero: torch.dtype
) -> None:
    """A 0-d operand takes part in promotion by its category only; batched, it has a batch
    dimension, so it was cast within its category alone (float32 + a complex128 0-d value
    gave complex128, a BatchingRuleError)."""
    xs = [torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0.5, -1.0, 2.0])]
    fn = _promoted(dims, zero)
    for got, want in zip(bf.batch_map(fn, xs), [fn(x) for x in xs], strict=True):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("lengths", [[2, 2], [2, 3, 0]])
def test_cat_skips_one_dimensional_empty_tensors_as_eagerly(lengths: list[int]) -> None:
    """``torch.cat([h, torch.zeros(0)])`` skips the empty vector eagerly; batched, it has a
    batch dimension and a rank of two (a BatchingRuleError)."""
    torch.manual_seed(0)
    layer = nn.Linear(4, 4).double()

    def fn(x: list[list[float]]) -> torch.Tensor:
        h = layer(torch.tensor(x, dtype=torch.float64).reshape(-1, 4))
        return torch.cat([torch.zeros(0, dtype=torch.float64), h, torch.tensor([], dtype=h.dtype)])

    xs = [torch.randn(n, 4).tolist() for n in lengths]
    assert_matches_eager(fn, xs, layer)
