"""batch_map equals eager execution, or refuses with a clear error, in the corners of PyTorch.

One test per case that once gave a silently different number: grad modes inside the
function, randomness and in-place changes on shared tensors, in-place writes and aliases,
shared operands with three or more dims, 0-d dtype promotion, ops with many outputs; and
one per case that once crashed or misled: keyword-only arguments, value-shaped ops,
probability targets, nesting, threads, recursion, stuck instances (a failing rule:
test_execute.py).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import batchfold as bf
from batchfold.graph import Slot
from reference import assert_matches_eager

SCHEDULERS = ["agenda", "depth"]
pytestmark = pytest.mark.usefixtures("float64")


@pytest.mark.parametrize("scheduler", SCHEDULERS)
@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "enable_grad_inside_no_grad"])
def test_nodes_run_under_the_grad_mode_they_were_recorded_in(scheduler: str, mode: str) -> None:
    lin = nn.Linear(3, 3)

    def fn(x: list[float]) -> torch.Tensor:
        t = torch.tensor(x)
        if mode == "no_grad":
            with torch.no_grad():
                target = lin(t)
        elif mode == "inference_mode":
            with torch.inference_mode():
                target = lin(t).clone()
            target = target.clone()
        else:
            with torch.no_grad(), torch.enable_grad():
                target = lin(t)
        return ((lin(t) - target) ** 2).sum() + (target * 2).sum()

    xs = [[1.0, 2.0, 3.0], [0.5, -1.0, 2.0], [0.0, 1.0, 1.0]]
    if mode == "inference_mode":  # eager cannot save inference tensors for backward either
        got = bf.batch_map(fn, xs, scheduler=scheduler)  # type: ignore[arg-type]
        for g, x in zip(got, xs, strict=True):
            torch.testing.assert_close(g, fn(x))
        return
    assert_matches_eager(fn, xs, lin, scheduler)  # type: ignore[arg-type]


def test_whole_batch_map_under_no_grad_gives_no_graph() -> None:
    lin = nn.Linear(2, 2)
    with torch.no_grad():
        out = bf.batch_map(lambda x: lin(torch.tensor(x)), [[1.0, 2.0]] * 3)
    assert not any(o.requires_grad for o in out)


def test_random_calls_on_shared_tensors_draw_anew_each_time() -> None:
    h0 = torch.ones(2000)

    def fn(_: int) -> tuple[torch.Tensor, ...]:
        one = torch.tensor(1.0)
        return (
            F.dropout(h0, 0.5, training=True) * one,
            F.dropout(h0, 0.5, training=True) * one,
            torch.bernoulli(h0 * 0.5) * one,
            torch.rand_like(h0) * one,
            torch.poisson(h0) * one,
        )

    (a1, a2, b, r, p), (c1, *_) = bf.batch_map(fn, [0, 1])
    assert not torch.equal(a1, a2) and not torch.equal(a1, c1)
    for x in (a1, b, r, p):
        assert x.std() > 0.1  # really random, not a constant


def test_a_shared_tensor_changed_in_place_between_instances_is_refused() -> None:
    shared = torch.ones(3)

    def fn(x: float) -> torch.Tensor:
        out = torch.tensor(x) * shared
        shared.add_(1.0)
        return out

    with pytest.raises(bf.UnsupportedOpError, match="changed in place .*before batch_map ran"):
        bf.batch_map(fn, [1.0, 2.0])


def test_memoised_calls_see_in_place_changes_of_shared_tensors() -> None:
    shared = torch.ones(3)

    def fn(x: float) -> torch.Tensor:
        doubled = shared * 2  # no lazy input: runs at once, memoised by version
        shared.add_(1.0)
        return doubled * torch.tensor(x)

    got = bf.batch_map(fn, [1.0, 2.0])
    torch.testing.assert_close(got, [torch.full((3,), 2.0), torch.full((3,), 8.0)])  # as eagerly


def test_a_write_into_a_memoised_result_of_one_call_leaves_later_calls_their_own() -> None:
    weight = torch.randn(3)

    def fn(x: float) -> torch.Tensor:
        with torch.no_grad():
            scaled = torch.sigmoid(weight)  # no lazy input: runs at once, memoised
            scaled.mul_(x)  # in place: eagerly into this call's tensor only
            again = torch.sigmoid(weight)  # a tensor of its own, as eagerly
            again[0] = -1.0
            shifted = torch.tanh(weight) - 0.5
            F.leaky_relu(shifted, 0.1, inplace=True)  # a write by keyword (not idempotent)
            target = torch.cos(weight) * 1
            torch.add(weight, x, out=target)  # and by out=
        return (scaled + again + shifted + target) * torch.tensor(1.0)

    got = bf.batch_map(fn, [2.0, 3.0])
    torch.testing.assert_close(got, [fn(2.0), fn(3.0)])


def test_a_write_into_a_memoised_result_that_several_calls_got_is_refused() -> None:
    weight = torch.randn(3)

    def fn(x: float) -> torch.Tensor:
        first, second = weight.t(), weight.t()  # eagerly two tensors; here one, memoised
        second.mul_(x)  # eagerly writes weight through second (a view), never first
        return first * torch.tensor(1.0)

    with pytest.raises(bf.UnsupportedOpError, match=r"mul_ at .*2 calls got.*\.clone\(\)"):
        bf.batch_map(fn, [2.0])

    def views(x: float) -> torch.Tensor:
        with torch.no_grad():
            copy, other = weight * 1, weight * 1  # two calls, one memoised result
            copy[0].add_(x)  # into a view of it
        return other * torch.tensor(1.0)

    with pytest.raises(bf.UnsupportedOpError, match="2 calls got"):
        bf.batch_map(views, [1.0])

    def by_keyword(x: float) -> torch.Tensor:
        first, second = torch.sigmoid(weight) - x, torch.sigmoid(weight) - x
        F.relu(second, inplace=True)  # eagerly first keeps its negative entries
        return first * torch.tensor(1.0)

    def by_out(x: float) -> torch.Tensor:
        first, second = weight * 2, weight * 2
        torch.add(weight, x, out=second)
        return first * torch.tensor(1.0)

    for fn in (by_keyword, by_out):
        with pytest.raises(bf.UnsupportedOpError, match="2 calls got"):
            bf.batch_map(fn, [0.5])


@pytest.mark.parametrize("batched", [False, True])
def test_a_function_whose_outputs_share_memory_refuses_writes_into_them(batched: bool) -> None:
    def shares(x: torch.Tensor) -> Any:  # eagerly the first two are one tensor, the last x
        t = x.tanh() * 1
        return t, t, x

    def fresh(x: torch.Tensor) -> Any:
        return x.tanh(), x * 2

    sharing, new = bf.function(shares, batched=batched), bf.function(fresh, batched=batched)
    xs = [torch.randn(3) for _ in range(3)]

    def written(f: Any) -> Any:
        def fn(x: torch.Tensor) -> Any:
            outs = f(torch.as_tensor(x) * 1)
            outs[0].mul_(3)  # eagerly seen through what shares its memory
            return outs

        return fn

    with pytest.raises(bf.UnsupportedOpError, match="writes into a view"):
        bf.batch_map(written(sharing), xs)
    assert_matches_eager(written(new), xs)  # nothing shared: the write is recorded
    assert_matches_eager(lambda x: sharing(torch.as_tensor(x) * 1), xs)  # no write: as ever


def _alias_cases() -> dict[str, Any]:
    def iadd(x: list[float]) -> Any:
        t = torch.tensor(x)
        u = t
        t += 1
        t *= torch.tensor(2.0)
        return u

    def method(x: list[float]) -> Any:
        t = torch.tensor(x)
        u = t
        t.mul_(3).add_(torch.tensor(x))
        return u, t

    def relu_inplace(x: list[float]) -> Any:
        t = torch.tensor(x)
        F.relu(t, inplace=True)
        torch.sigmoid_(t)
        return t

    def out_kwarg(x: list[float]) -> Any:
        a = torch.tensor(x)
        o = torch.zeros(len(x))
        torch.add(a, 1, out=o)
        return o

    def dtype_kept(x: list[float]) -> Any:
        t = torch.tensor([1, 2, 3], dtype=torch.int32)
        t += torch.tensor(x).long()  # int64 values into an int32 tensor: cast as eagerly
        half = torch.tensor(x).half()
        half *= torch.tensor(3.0)  # a 0-d float64 into a float16 tensor
        return t, half

    def setitem_then_view(x: list[float]) -> Any:
        t = torch.tensor(x)
        t[0] = 100.0
        return t[:2]

    def copy_and_fill(x: list[float]) -> Any:
        t = torch.zeros(3)
        t.copy_(torch.tensor(x))
        s = torch.zeros(3)
        s.fill_(2.0)
        return t * s

    return {
        "iadd": iadd,
        "method": method,
        "relu_inplace": relu_inplace,
        "out_kwarg": out_kwarg,
        "dtype_kept": dtype_kept,
        "setitem_then_view": setitem_then_view,
        "copy_and_fill": copy_and_fill,
    }


@pytest.mark.parametrize("name", list(_alias_cases()))
@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_in_place_writes_are_seen_by_every_alias(name: str, scheduler: str) -> None:
    fn = _alias_cases()[name]
    assert_matches_eager(fn, [[1.0, -2.0, 3.0], [0.5, 0.0, -1.0]], None, scheduler)  # type: ignore[arg-type]


def test_a_write_a_live_view_would_see_is_refused() -> None:
    def through_base(x: list[float]) -> torch.Tensor:
        t = torch.tensor(x)
        v = t[:2]
        t[0] = 100.0
        return v

    def through_view(x: list[float]) -> torch.Tensor:
        t = torch.tensor(x)
        row = t.view(1, 3)[0]
        row += 1
        return t

    def chained(x: list[float]) -> torch.Tensor:
        t = torch.tensor(x).reshape(1, 3)
        t[0][1] = 5.0
        return t

    with pytest.raises(bf.UnsupportedOpError, match="while a view of it .* is still in use"):
        bf.batch_map(through_base, [[1.0, 2.0, 3.0]])
    for fn in (through_view, chained):
        with pytest.raises(bf.UnsupportedOpError, match="writes into a view"):
            bf.batch_map(fn, [[1.0, 2.0, 3.0]])


def test_writing_per_instance_values_into_a_shared_tensor_is_refused() -> None:
    shared = torch.zeros(3)
    with pytest.raises(bf.UnsupportedOpError, match="out= must be a lazy tensor"):
        bf.batch_map(lambda x: torch.add(torch.tensor(x), 1, out=shared), [[1.0, 2.0, 3.0]])
    with pytest.raises(bf.UnsupportedOpError, match="into a tensor from outside"):
        bf.batch_map(lambda x: torch.Tensor.add_(shared, torch.tensor(x)), [[1.0, 2.0, 3.0]])


@pytest.mark.parametrize("batch", [2, 3])
@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_shared_operands_with_three_or_more_dims_keep_their_leading_dims(
    batch: int, scheduler: str
) -> None:
    w3 = nn.Parameter(torch.randn(2, 3, 4))
    w4 = nn.Parameter(torch.randn(2, 1, 4, 3))
    holder = nn.ParameterList([w3, w4])

    def fn(x: list[float]) -> Any:
        v = torch.tensor(x)  # [3]
        m = torch.stack([v, v * 2])  # [2, 3]
        return (
            v @ w3,  # [2, 4]
            m @ w3,  # [2, 2, 4]
            torch.matmul(w4, v),  # [2, 1, 4]
            w4 @ m.T,  # [2, 1, 4, 2]
            v * w3.sum(-1),  # per-instance [3] broadcast against shared [2, 3]
            torch.where(v > 0, w3[0, :, 0], v),
        )

    xs = [[float(i), -1.0, 2.0 * i] for i in range(batch)]
    assert_matches_eager(fn, xs, holder, scheduler)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("tensor_dtype", "scalar_dtype"),
    [
        (torch.float16, torch.float32),
        (torch.float32, torch.float64),
        (torch.int32, torch.int64),
        (torch.int16, torch.int32),
        (torch.int32, torch.float64),  # a 0-d float beats an int tensor: float64
        (torch.float32, torch.int64),
    ],
)
def test_0d_operands_follow_eager_type_promotion(
    tensor_dtype: torch.dtype, scalar_dtype: torch.dtype
) -> None:
    def fn(x: int) -> Any:
        t = torch.tensor([x, x + 1, x + 2]).to(tensor_dtype)
        s = torch.tensor(x + 1).to(scalar_dtype)
        return (
            t * s,
            t + s,
            torch.where(t > 1, t, s),
            torch.maximum(s, t),
            torch.where(s > 2, t, s),  # a 0-d condition: no part of the promotion
            t.where(s > 2, s),
        )

    assert_matches_eager(fn, [1, 2, 3])  # type: ignore[arg-type]


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_a_cast_to_another_tensors_dtype_takes_no_operand(scheduler: str) -> None:
    """``x.to(other)`` and ``x.type_as(other)`` read only ``other``'s dtype: they were refused
    as ops mixing float dtypes, or failed in a batching rule for a 0-d ``other``."""
    layer = nn.Linear(3, 2).double()

    def fn(x: list[float]) -> Any:
        h = torch.tensor(x)  # float32
        wide = layer(h.type_as(layer.weight))  # float64, as the layer's weights
        return (
            wide,
            h.to(wide),
            h.type_as(wide[0]),  # a 0-d other
            wide.to(h) * h[:2],
            wide.type_as(layer.weight.float()),
            layer.bias.to(h) * h[:2],  # a shared tensor cast to an instance's dtype
        )

    assert_matches_eager(fn, [[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]], layer, scheduler)  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 0])  # vectors of one length, or sequences of several
def test_half_precision_by_a_wider_0d_value_rounds_where_eager_does(
    dtype: torch.dtype, rows: int
) -> None:
    """Eagerly ``h * c`` and ``h / c`` with a float32 0-d ``c`` compute at float32 and round
    once, where ``c * h`` and ``h + c`` round ``c`` first; batched, ``c`` was rounded first for
    all of them (``[1, 0, 3] * 0.1`` gave 0.2998 against eager's 0.3000)."""
    gen = torch.Generator().manual_seed(0)
    items = [
        ((torch.randn(5 if rows else 2 + i, 3, generator=gen) * 3).to(dtype), 0.1 + i)
        for i in range(4)
    ]

    def fn(item: tuple[torch.Tensor, float]) -> Any:
        h, c = torch.as_tensor(item[0]), torch.tensor(item[1])
        return h * c, h / c, c * h, h + c, torch.mul(h, c), h.div(c)

    for got, want in zip(bf.batch_map(fn, items), [fn(x) for x in items], strict=True):
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype == dtype and torch.equal(g, w)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 0])
def test_half_precision_floor_division_by_a_wider_0d_value_rounds_where_eager_does(
    dtype: torch.dtype, rows: int
) -> None:
    """``h // c`` and ``torch.div(h, c, rounding_mode=...)`` keep a float32 0-d ``c`` at
    float32 eagerly, as ``h / c`` does: 1.5 // 0.75148 is 1, where ``c`` rounded to 0.75
    first gave 2."""
    gen = torch.Generator().manual_seed(0)
    items = [(torch.tensor([[-0.0942, 1.5, -1.5703]]).to(dtype), 0.7514795064926147)] + [
        ((torch.randn(5 if rows else 2 + i, 3, generator=gen) * 9).to(dtype), 0.3 + i / 7)
        for i in range(4)
    ]

    def fn(item: tuple[torch.Tensor, float]) -> Any:
        h, c = torch.as_tensor(item[0]), torch.tensor(item[1])
        return (
            h // c,
            torch.floor_divide(h, c),
            torch.div(h, c, rounding_mode="floor"),
            torch.div(h, c, rounding_mode="trunc"),
        )

    for got, want in zip(bf.batch_map(fn, items), [fn(x) for x in items], strict=True):
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype == dtype and torch.equal(g, w)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("ragged", [True, False])
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_half_precision_cross_entropy_over_rows_adds_up_as_eager(
    dtype: torch.dtype, ragged: bool, reduction: str
) -> None:
    """Eager sums the rows' losses in half precision its own way; the sum of the rows' losses
    (a segment sum at float32) differed in the last place (41.25 against eager's 41.0)."""
    gen = torch.Generator().manual_seed(0)
    items = [(torch.randn(n, 4, generator=gen) * 4).to(dtype) for n in (7, 6, 6, 300, 0)]

    def fn(x: torch.Tensor) -> torch.Tensor:
        h = torch.as_tensor(x)
        target = torch.arange(len(h)) % 4
        return F.cross_entropy(h, target, reduction=reduction)

    got = bf.batch_map(fn, items, ragged=ragged)
    for g, x in zip(got, items, strict=True):
        want = fn(x)
        assert g.dtype == want.dtype and torch.equal(g.nan_to_num(-1.0), want.nan_to_num(-1.0))


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_a_per_instance_0d_value_given_as_a_number_is_read_as_eagerly(scheduler: str) -> None:
    """A lazy 0-d value where PyTorch takes a number (a dim, a count, a slope) is read, as
    eager reads it: taken as a tensor operand, ``h.unsqueeze(d)`` got a stand-in's dim (the
    wrong shape), and most such calls failed in their batching rule."""
    layer = nn.Linear(3, 3).double()

    def fn(x: list[float]) -> Any:
        h = layer(torch.tensor(x))  # [3]
        d = torch.tensor(int(x[0]))  # 0 or 1
        n, slope = (h > -10).sum(), torch.tensor(x[1])  # 3, and a float
        m = h[None].expand(2, 3)
        return (
            m.unsqueeze(d),
            m.unsqueeze(1).squeeze(d + 1),
            m[None].flatten(d),
            m.softmax(d),
            m.sum(d),
            F.leaky_relu(h, slope),  # type: ignore[arg-type]
            torch.add(h, h, alpha=slope),  # type: ignore[arg-type]
            h.topk(n - 1).values,
            F.pad(h, (0, n)),
            F.one_hot(n - 1, num_classes=n),
        )

    xs = [[0.0, 0.5, 1.0], [1.0, -2.0, 3.0], [0.0, 0.25, -1.0]]
    assert_matches_eager(fn, xs, layer, scheduler)  # type: ignore[arg-type]


def test_a_value_that_requires_grad_given_as_a_number_is_refused_as_eagerly() -> None:
    # read as a number, its gradient was silently lost; eager PyTorch raises
    items = [torch.tensor(0.5, dtype=torch.float64, requires_grad=True)]

    def fn(s: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(-torch.ones(3, dtype=torch.float64), torch.as_tensor(s))  # type: ignore[arg-type]

    with pytest.raises(TypeError, match="must be Number, not Tensor"):
        fn(items[0])
    with pytest.raises(TypeError, match="must be Number, not Tensor"):
        bf.batch_map(fn, items)


def test_a_python_type_as_dtype_and_a_memoryview_make_what_eager_makes() -> None:
    # dtype=float reached the fast path of numbers as a dtype (an AttributeError), and a
    # writable memoryview's hash a ValueError where an unhashable object's is a TypeError
    def fn(x: float) -> Any:
        view = memoryview(bytearray(np.array([x, 2 * x]).tobytes())).cast("d")
        made = torch.tensor(x, dtype=float), torch.tensor(int(x), dtype=int)  # type: ignore[arg-type]
        return (*made, torch.tensor(view))

    for got, want in zip(bf.batch_map(fn, [1.0, 2.5]), [fn(x) for x in (1.0, 2.5)], strict=True):
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and torch.equal(g, w)


def test_a_value_moved_to_another_device_is_on_it_for_the_ops_after() -> None:
    # an op's outputs were put on its inputs' device: h.to(d).device said the old one, and
    # an op with a tensor on d was refused as mixing devices (meta stands in for a GPU here)
    weight = torch.ones(3, 3, device="meta")

    def fn(x: torch.Tensor) -> Any:
        h = torch.as_tensor(x)
        return (
            h.to("meta") @ weight,
            torch.zeros_like(h, device="meta") + weight[0],
            h.new_zeros(2, device="meta"),
            torch.as_tensor(h * 1, device="meta") * 2,
            h.to("meta").device.type,
        )

    items = [torch.arange(3.0), torch.ones(3)]
    for got, want in zip(bf.batch_map(fn, items), [fn(x) for x in items], strict=True):
        assert got[-1] == want[-1] == "meta"
        for g, w in zip(got[:-1], want[:-1], strict=True):
            assert (g.shape, g.dtype, g.device) == (w.shape, w.dtype, w.device)


@pytest.mark.filterwarnings("ignore:__array_wrap__ must accept context:DeprecationWarning")
def test_numpy_functions_that_fall_back_on_a_type_error_read_the_value() -> None:
    # np.argmax(h) calls h.argmax(axis=None, out=None): eager PyTorch raises a TypeError and
    # NumPy reads the array instead; a ShapeError alone (a ValueError) came up
    def fn(x: torch.Tensor) -> int:
        return int(np.argmax(torch.as_tensor(x) * 2))

    items = [torch.tensor([1.0, 3.0, 2.0]), torch.tensor([5.0, 0.0, 1.0])]
    assert bf.batch_map(fn, items) == [fn(x) for x in items] == [1, 0]
    call = lambda x: torch.as_tensor(x).argmax(axis=None, out=None)  # type: ignore[call-arg]  # noqa: E731
    with pytest.raises(TypeError):  # eager's error is a TypeError, and so is batch_map's
        call(items[0])
    with pytest.raises(TypeError):
        bf.batch_map(call, items)


def test_an_op_with_more_outputs_than_value_ids_hold_is_refused() -> None:
    with pytest.raises(bf.UnsupportedOpError, match="returns 70000 tensors; .* at most 65536"):
        bf.batch_map(lambda x: torch.arange(70000.0).mul(torch.tensor(x)).unbind(0), [1.0])


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_tensor_arguments_passed_by_keyword(scheduler: str) -> None:
    def fn(x: list[float]) -> Any:
        t = torch.tensor(x)
        m = t.reshape(2, 2)
        return (
            torch.cat(tensors=[t, t * 2]),
            torch.stack(tensors=[t, t], dim=1),
            torch.softmax(input=t, dim=0),
            torch.sum(input=t),
            torch.transpose(input=m, dim0=0, dim1=1),
            torch.tanh(input=t),
        )

    assert_matches_eager(fn, [[1.0, 2.0, 3.0, 4.0], [0.0, -1.0, 0.5, 2.0]], None, scheduler)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("code", "fix"),
    [
        (lambda t: torch.nonzero(t), r"torch.where\(x != 0, x, 0\)"),
        (lambda t: t.argwhere(), "keeps the shape"),
        (lambda t: torch.unique(t), "sort"),
        (lambda t: t[t > 0], r"torch.where\(mask, x, 0\)"),
        (lambda t: torch.masked_select(t, t > 0), r"torch.where\(mask, x, 0\)"),
        (lambda t: torch.bincount(t.long()), "one_hot"),
        (lambda t: torch.repeat_interleave(t, t.long()), "Python int"),
        (lambda t: torch.where(t > 0), "three arguments"),
        (
            lambda t: nn.utils.rnn.pack_sequence([t.view(-1, 1)]),
            "call the recurrent layer on each sequence itself",
        ),
    ],
)
def test_value_shaped_ops_are_refused_with_the_right_way(code: Any, fix: str) -> None:
    with pytest.raises(bf.UnsupportedOpError, match="depends on per-instance values") as info:
        bf.batch_map(lambda x: code(torch.tensor(x)), [[1.0, 0.0], [0.0, 0.0]])
    assert fix.replace("\\", "") in str(info.value) or pytest.fail(str(info.value))
    assert "test_eager_semantics.py" in str(info.value)


def test_static_shaped_cousins_of_value_shaped_ops_still_record() -> None:
    def fn(x: list[float]) -> Any:
        t = torch.tensor(x)
        return torch.repeat_interleave(t, 2), torch.where(t > 0, t, 0.0)

    assert_matches_eager(fn, [[1.0, 0.0], [0.0, 2.0]])  # type: ignore[arg-type]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_with_probability_targets(reduction: str) -> None:
    head = nn.Linear(3, 4)

    def fn(x: list[float]) -> torch.Tensor:
        logits = head(torch.tensor(x))
        target = torch.softmax(torch.tensor(x + [0.0]) * 2, 0)
        return F.cross_entropy(logits, target, reduction=reduction, label_smoothing=0.1)

    assert_matches_eager(fn, [[1.0, 2.0, 3.0], [0.0, -1.0, 0.5]], head)  # type: ignore[arg-type]


def test_nested_batch_map_joins_the_outer_batch() -> None:
    lin = nn.Linear(2, 2)

    def inner(v: list[float]) -> torch.Tensor:
        return torch.tanh(lin(torch.tensor(v)))

    def outer(group: list[list[float]]) -> torch.Tensor:
        return torch.stack(bf.batch_map(inner, group)).sum(0)

    groups = [[[1.0, 2.0], [3.0, 4.0]], [[0.5, 0.5]]]
    stats = assert_matches_eager(outer, groups, lin)  # type: ignore[arg-type]
    assert stats.steps < stats.nodes  # the inner instances were batched together
    with pytest.raises(ValueError, match="nested"):
        bf.batch_map(lambda g: bf.batch_map(inner, g, return_stats=True), groups)


def test_two_threads_record_into_their_own_batches() -> None:
    cell = bf.function(nn.Linear(4, 4), batched=True)
    results: dict[int, Any] = {}
    barrier = threading.Barrier(2)

    def work(k: int) -> None:
        def fn(x: float) -> torch.Tensor:
            barrier.wait(timeout=10)  # both threads record at the same time
            h = torch.full((4,), x)
            for _ in range(3):
                h = torch.tanh(cell(h))
            return h

        try:
            results[k] = bf.batch_map(fn, [float(k), float(k) + 0.5], return_stats=True)
        except BaseException as error:  # reported below
            results[k] = error

    threads = [threading.Thread(target=work, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for k in (0, 1):
        outputs, stats = results[k]
        assert stats.instances == 2 and stats.nodes == 2 + 2 * 3 * 2
        for x, out in zip([float(k), float(k) + 0.5], outputs, strict=True):
            torch.testing.assert_close(out, _eager_cell(cell.fn, x))


def _eager_cell(lin: nn.Module, x: float) -> torch.Tensor:
    h = torch.full((4,), x)
    for _ in range(3):
        h = torch.tanh(lin(h))
    return h


def test_a_recursion_error_in_user_code_is_not_called_a_shape_error() -> None:
    def deep(t: torch.Tensor, n: int) -> torch.Tensor:
        return deep(t + 1, n + 1)  # never ends: each level records an add

    with pytest.raises(RecursionError):
        bf.batch_map(lambda x: deep(torch.tensor(x), 0), [1.0])


def test_an_instance_that_will_not_exit_after_an_error_is_bounded() -> None:
    tries = []

    def fn(i: int) -> torch.Tensor:
        x = torch.tensor(float(i)) * 2
        if i == 0:
            x.item()
            raise KeyError("instance 0 fails")
        while True:
            try:
                (x + len(tries)).item()  # a new value to wait for on every try
                break
            except BaseException:
                tries.append(1)
                if len(tries) > 100:
                    raise AssertionError("cleanup did not stop") from None
        return x

    with pytest.raises(KeyError, match="instance 0 fails") as info:
        bf.batch_map(fn, [0, 1])
    assert "left paused" in "".join(getattr(info.value, "__notes__", []))
    assert len(tries) == 3


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_per_instance_by_per_instance_products_batch_without_vmap(scheduler: str) -> None:
    lin = nn.Linear(3, 3)

    def fn(x: list[float]) -> Any:
        v = lin(torch.tensor(x))  # [3]
        m = torch.outer(v, v) + torch.eye(3)  # [3, 3]
        t = torch.stack([m, m * 2])  # [2, 3, 3]
        return v @ v, m @ v, v @ m, m @ m, torch.mv(m, v), torch.mm(m, m), torch.bmm(t, t), t @ v

    stats = assert_matches_eager(fn, [[1.0, 2.0, 3.0], [0.5, -1.0, 0.0]], lin, scheduler)  # type: ignore[arg-type]
    assert not any(
        "matmul" in name or name.startswith(("mv", "mm", "bmm")) for name in stats.fallbacks
    )


def test_new_tensor_methods_make_per_instance_constants() -> None:
    def fn(x: list[float]) -> Any:
        t = torch.tensor(x, dtype=torch.float32)
        return (
            t + t.new_zeros(3),
            t * t.new_ones((3,)),
            t.new_full((2,), 7.0),
            t.new_tensor([1, 2, 3]) + t,
            t.new_empty(3).shape == (3,),
        )

    out = bf.batch_map(fn, [[1.0, 2.0, 3.0]] * 2)
    for got in out:
        want = fn([1.0, 2.0, 3.0])
        for g, w in zip(got[:4], want[:4], strict=True):
            torch.testing.assert_close(g, w)
            assert g.dtype == torch.float32
        assert got[4]


def test_shapes_inferred_once_follow_shared_index_values_and_the_default_dtype() -> None:
    """Output shapes are kept for the life of the process (``inference_key``); a shared
    integer tensor's values and the default dtype still decide them as in eager PyTorch."""
    from batchfold.lazy.inference import inference_key

    weight = torch.randn(3, 2)
    assert inference_key(F.linear, (Slot(0), weight), {}, ()) is not None
    assert inference_key(torch.index_select, (Slot(0), 0, torch.tensor([1])), {}, ()) is None
    assert inference_key(torch.add, (Slot(0), weight.to_sparse()), {}, ()) is None
    for kept in ([True, False, True], [True, True, True], [False, True, False]):
        mask = torch.tensor(kept)  # the same call and metas, other values: other shapes
        assert_matches_eager(lambda x, m=mask: torch.tensor(x)[m] * 2, [[1.0, 2, 3], [4, 5, 6]])
    for dtype in (torch.float32, torch.float64, torch.float32):
        with default_dtype(dtype):
            (out,) = bf.batch_map(lambda n: torch.tensor(n) + 0.5, [3])
            assert out.dtype == dtype and out.item() == 3.5


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Any:
    """Run a block with another default dtype."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def test_batch_norm_running_statistics_follow_eager() -> None:
    """Finding output shapes runs no op on the user's tensors: batch_norm's running statistics
    see exactly the updates of one-at-a-time execution."""
    xs = [[[1.0, 2, 3], [4, 5, 6]], [[1.0, 0, 3], [2, 5, 1]], [[0.5, 1, 2], [3, 1, 4]]]
    batched, eager = nn.BatchNorm1d(3), nn.BatchNorm1d(3)
    outs = bf.batch_map(lambda x: batched(torch.tensor(x)), xs)
    for x, out in zip(xs, outs, strict=True):
        torch.testing.assert_close(out, eager(torch.tensor(x)))
    for name, value in eager.state_dict().items():
        torch.testing.assert_close(batched.state_dict()[name], value, msg=name)


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_enable_grad_inside_an_outer_no_grad_keeps_history_through_every_step(
    scheduler: str,
) -> None:
    """Gathers, splits and the returned values keep the grad mode of the ops that made them,
    not the caller's: here the caller's no_grad, the function's enable_grad."""
    w = nn.Parameter(torch.randn(3, 3))
    gen = torch.Generator().manual_seed(3)
    xs = [(torch.randn(3, generator=gen) * 2).tolist() for _ in range(6)]

    def fn(x: list[float]) -> torch.Tensor:
        with torch.enable_grad():
            h = torch.tensor(x) @ w
            h = torch.tanh(h) if sum(x) > 0 else torch.sin(h)  # two branches: rows are gathered
            return h @ w

    with torch.no_grad():
        want = [fn(x) for x in xs]
        got = bf.batch_map(fn, xs, scheduler=scheduler)  # type: ignore[arg-type]
    assert all(g.requires_grad for g in got) and all(v.requires_grad for v in want)
    for g, v in zip(got, want, strict=True):
        torch.testing.assert_close(g, v)
    (want_grad,) = torch.autograd.grad(torch.stack(want).sum(), w)
    (got_grad,) = torch.autograd.grad(torch.stack(got).sum(), w)
    torch.testing.assert_close(got_grad, want_grad)


def test_in_place_random_fills_draw_eagers_numbers() -> None:
    """``x.normal_()`` and ``x.uniform_(a, b)`` on a value made inside (how distributions'
    ``rsample`` draws) were refused as in-place ops with no out-of-place form."""
    head = nn.Linear(4, 2)
    xs = [torch.randn(4) for _ in range(3)]

    def fn(x: torch.Tensor) -> torch.Tensor:
        mu = head(torch.as_tensor(x))
        sample = torch.distributions.Normal(mu, 0.5, validate_args=False).rsample()
        return sample + torch.empty(2).uniform_(-2.0, 3.0) + torch.empty(2).random_(5, 9)

    got = _same_draws(fn, xs, seed=3)
    (grad,) = torch.autograd.grad(torch.stack(got).sum(), head.weight)
    assert grad.abs().sum() > 0  # the sample is differentiable in mu, as eagerly


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_a_value_overwritten_in_place_keeps_requiring_grad(scheduler: str) -> None:
    """``h.copy_(src)`` or ``h.normal_()`` over a value that requires grad: eagerly the result
    still requires grad (its history gets a zero gradient); batch_map gave a value that did
    not, so a loss on it alone could not be differentiated."""
    layer = nn.Linear(3, 3)
    source = torch.ones(3)

    def fn(x: list[float]) -> Any:
        h, g = layer(torch.tensor(x)), layer(torch.tensor(x) * 2)
        h.copy_(source)  # from outside
        g.copy_(torch.tensor(x).float() * 3)  # from a value that needs no grad
        return h, g

    assert_matches_eager(fn, [[1.0, 2.0, 3.0], [0.0, -1.0, 0.5]], layer, scheduler)  # type: ignore[arg-type]

    def drawn(x: torch.Tensor) -> torch.Tensor:
        h = layer(torch.as_tensor(x))
        return h.normal_() + layer(torch.as_tensor(x))

    xs = [torch.randn(3) for _ in range(2)]
    _same_draws(drawn, xs, seed=1)
    alone = bf.batch_map(lambda x: layer(torch.as_tensor(x)).normal_(), xs)
    assert all(t.requires_grad for t in alone)  # as layer(x).normal_() eagerly


def _same_draws(fn: Any, xs: list[Any], seed: int) -> list[torch.Tensor]:
    """``fn`` eagerly and through batch_map from the same seed: the same numbers drawn (for
    the in-place random fills and ``rsample``, which draw at the call). The batched results."""
    torch.manual_seed(seed)
    want = [fn(x) for x in xs]
    torch.manual_seed(seed)
    got = bf.batch_map(fn, xs)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    return got
