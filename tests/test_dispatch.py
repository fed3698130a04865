"""PyTorch's Python-level functions reach the recorder on a shorter path inside ``batch_map``
(``batchfold.lazy.dispatch``): the same plan, values and gradients as PyTorch's own path and
as eager execution, and PyTorch's function back in place afterwards."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
import torch
import torch._tensor
import torch.nn.functional as F
from torch import nn

import batchfold as bf
from batchfold.lazy import dispatch
from batchfold.lazy.kept import forget
from batchfold.schedule import Scheduler
from reference import assert_matches_eager, flat_tensors


class Head(nn.Module):
    """Python-level functions of torch.nn.functional, torch.functional and Tensor methods."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.layer_norm(F.relu(self.lin(x)), (6,))
        h = F.dropout(h, p=0.3, training=self.training)  # random: drawn per instance
        F.leaky_relu(h, 0.1, inplace=True)  # in place, by keyword
        a, b = h.split(3, dim=-1)  # Tensor.split is Python (torch._tensor)
        with torch.no_grad():  # no gradient reaches lin through the weights
            weights = F.softmax(b, dim=-1)
        mixed = torch.einsum("i,i->i", a, weights)  # torch.functional
        return F.log_softmax(torch.cat([mixed, a]), dim=-1)


def _loss(model: Head, item: tuple[torch.Tensor, int]) -> torch.Tensor:
    x, label = item
    logits = model(torch.as_tensor(x))
    return F.cross_entropy(logits, torch.tensor(label)) + F.mse_loss(logits, logits.tanh())


def _run(model: Head, items: list[tuple[torch.Tensor, int]], scheduler: Scheduler):
    forget()  # each run traces its module calls itself
    losses, stats = bf.batch_map(
        lambda i: _loss(model, i), items, scheduler=scheduler, return_stats=True
    )
    grads = torch.autograd.grad(torch.stack(losses).sum(), list(model.parameters()))
    assert stats.plan is not None
    return losses, grads, [(s.sig.name, len(s.nodes)) for s in stats.plan.steps]


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
@pytest.mark.parametrize("cache_modules", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("training", [False, True], ids=["eval", "dropout"])
def test_the_short_path_records_what_pytorchs_path_records(
    scheduler: Scheduler,
    cache_modules: bool,
    dtype: torch.dtype,
    training: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch.manual_seed(0)
    model = Head().to(dtype).train(training)
    if not cache_modules:
        bf.no_cache(model)
    items = [(torch.randn(6, dtype=dtype), i % 6) for i in range(9)]
    calls = []
    short = dispatch.handle

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(args[0])
        return short(*args, **kwargs)

    short_loss = dispatch.cross_entropy

    def counted_loss(*args: Any, **kwargs: Any) -> Any:
        calls.append(dispatch.ORIGINAL_CROSS_ENTROPY)
        return short_loss(*args, **kwargs)

    monkeypatch.setattr(dispatch, "handle", counted)
    monkeypatch.setattr(dispatch, "cross_entropy", counted_loss)
    torch.manual_seed(1)
    got, got_grads, got_plan = _run(model, items, scheduler)
    assert dispatch.ORIGINAL_CROSS_ENTROPY in calls and F.layer_norm in calls
    monkeypatch.setattr(dispatch, "handle", dispatch.ORIGINAL)  # PyTorch's own path
    monkeypatch.setattr(dispatch, "cross_entropy", dispatch.ORIGINAL_CROSS_ENTROPY)
    torch.manual_seed(1)
    want, want_grads, want_plan = _run(model, items, scheduler)
    assert got_plan == want_plan
    for g, w in zip([*got, *got_grads], [*want, *want_grads], strict=True):
        assert g.dtype == w.dtype == dtype
        torch.testing.assert_close(g, w, rtol=0, atol=0)  # the same draws, bit for bit
    if not training:  # dropout draws per instance in batch_map, in order eagerly
        eager = [_loss(model, i) for i in items]
        eager_grads = torch.autograd.grad(torch.stack(eager).sum(), list(model.parameters()))
        for g, e in zip([*got, *got_grads], [*eager, *eager_grads], strict=True):
            torch.testing.assert_close(g, e)


def test_pytorchs_function_is_back_after_batch_map_and_after_an_error() -> None:
    def fails(x: torch.Tensor) -> torch.Tensor:
        assert getattr(F, "handle_torch_function") is dispatch.handle  # noqa: B009
        raise ValueError("stop")

    seed = torch.manual_seed  # PyTorch's, wrapped by PyTorch once torch._dynamo is imported
    bf.batch_map(lambda x: F.relu(torch.as_tensor(x)), [torch.ones(2)])
    with pytest.raises(ValueError, match="stop"):
        bf.batch_map(fails, [torch.ones(2)])
    for module in (F, torch.functional, torch._tensor):
        assert module.handle_torch_function is torch.overrides.handle_torch_function
    assert torch.tensor is torch._C._VariableFunctions.tensor  # pyright: ignore[reportAttributeAccessIssue]
    assert F.cross_entropy is dispatch.ORIGINAL_CROSS_ENTROPY
    assert torch.as_tensor is dispatch.ORIGINAL_AS_TENSOR
    assert torch.manual_seed is seed


_LOSS_OPTIONS = [
    {},
    {"reduction": "mean", "ignore_index": -100},  # the defaults, named: batched with {}
    {"reduction": "sum", "label_smoothing": 0.1},
    {"ignore_index": 2},
    {"weight": torch.tensor([0.5, 1.0, 2.0, 1.5], dtype=torch.float64)},
]


def _losses(w: torch.Tensor, x: torch.Tensor, label: int) -> list[torch.Tensor]:
    logits = torch.as_tensor(x) @ w  # a per-instance value
    target = torch.tensor(label)
    return [F.cross_entropy(logits, target, **options) for options in _LOSS_OPTIONS] + [
        F.cross_entropy(logits[None], target[None]),  # a batch of one row
        F.cross_entropy(logits, w[0].softmax(-1)),  # class probabilities as the target
        F.cross_entropy(input=logits, target=target),  # the defaults, by keyword
        nn.CrossEntropyLoss(reduction="sum")(logits, target),
    ]


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_cross_entropys_short_path_gives_eagers_values_and_gradients(scheduler: Scheduler) -> None:
    torch.manual_seed(0)
    w = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    items = [(torch.randn(5, dtype=torch.float64), i % 4) for i in range(7)]
    got, stats = bf.batch_map(
        lambda item: _losses(w, *item), items, scheduler=scheduler, return_stats=True
    )
    eager = [_losses(w, *item) for item in items]
    flat_got = [loss for losses in got for loss in losses]
    flat_eager = [loss for losses in eager for loss in losses]
    for g, e in zip(flat_got, flat_eager, strict=True):
        torch.testing.assert_close(g, e, equal_nan=True)  # ignore_index 2: nan, as eagerly
    finite = [i for i, e in enumerate(flat_eager) if e.isfinite()]
    grad = torch.autograd.grad(torch.stack([flat_got[i] for i in finite]).sum(), w)
    want = torch.autograd.grad(torch.stack([flat_eager[i] for i in finite]).sum(), w)
    torch.testing.assert_close(grad, want)
    assert stats.plan is not None
    # the defaults named or left out are one signature: one step of 3 losses per instance
    names = [(s.sig.name, len(s.nodes)) for s in stats.plan.steps]
    assert ("cross_entropy", 3 * len(items)) in names


def _numbers(w: torch.Tensor, i: int) -> torch.Tensor:
    """``torch.tensor`` of numbers in the forms the short path takes, and two it declines."""
    a = torch.tensor(i)  # int64
    b = torch.tensor(i * 0.5)  # the default dtype
    c = torch.tensor(i % 2 == 0)  # bool
    d = torch.tensor(i, dtype=torch.float64, device="cpu")
    e = torch.tensor(float(i), dtype=torch.float64, requires_grad=True)  # declined
    with torch.no_grad():
        f = torch.tensor(2.0)
    g = torch.tensor([i, 1.0])  # a list: PyTorch's way
    return (w * (a + b + d + e + f)).sum() * g.sum() + c.double()


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_torch_tensor_of_a_number_takes_the_short_path_with_eagers_values(
    scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = torch.randn(3, dtype=torch.float64, requires_grad=True)
    reached = []
    original = dispatch.ORIGINAL_TENSOR

    def counted(data: object, *args: object, **kwargs: object) -> object:
        reached.append((type(data), kwargs.get("requires_grad", False)))
        return original(data, *args, **kwargs)

    monkeypatch.setattr(dispatch, "ORIGINAL_TENSOR", counted)
    monkeypatch.setattr(torch, "tensor", counted)  # where the stand-in goes (see dispatch.patch)
    got, stats = bf.batch_map(
        lambda i: _numbers(w, i), list(range(5)), scheduler=scheduler, return_stats=True
    )
    # numbers without requires_grad never reach PyTorch's torch.tensor
    assert all(kind is list or grad for kind, grad in reached) and (float, True) in reached
    got_grad = torch.autograd.grad(torch.stack(got).sum(), w)
    monkeypatch.setattr(dispatch, "tensor", original)  # the mode's path instead
    want, want_stats = bf.batch_map(
        lambda i: _numbers(w, i), list(range(5)), scheduler=scheduler, return_stats=True
    )
    want_grad = torch.autograd.grad(torch.stack(want).sum(), w)
    assert stats.plan is not None and want_stats.plan is not None
    assert [s.sig.name for s in stats.plan.steps] == [s.sig.name for s in want_stats.plan.steps]
    eager = [_numbers(w, i) for i in range(5)]
    eager_grad = torch.autograd.grad(torch.stack(eager).sum(), w)
    for g, m, e in zip([*got, *got_grad], [*want, *want_grad], [*eager, *eager_grad], strict=True):
        assert g.dtype == e.dtype
        torch.testing.assert_close(g, m, rtol=0, atol=0)
        torch.testing.assert_close(g, e)


def _arrays(w: torch.Tensor, item: tuple[torch.Tensor, np.ndarray, torch.Tensor]) -> Any:
    x, a, leaf = item
    dense = torch.as_tensor(x, dtype=torch.float64)  # a cast
    same = torch.as_tensor(x)  # no copy eagerly
    array = torch.as_tensor(a, device="cpu")
    grad = torch.as_tensor(leaf)  # requires grad: its gradient comes back to it
    listed = torch.as_tensor([1.0, 2.0, 3.0], dtype=torch.float64)  # PyTorch's way
    return (w * (dense + same.double() + array + listed) * grad).sum(), same


@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_torch_as_tensor_takes_the_short_path_with_eagers_values(
    scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    from batchfold.lazy.recorder import Recorder

    reached: list[object] = []  # as_tensor calls that took the mode's path
    call = Recorder.call

    def counted(self: Recorder, func: Any, args: Any, kwargs: Any) -> Any:
        if func is dispatch.ORIGINAL_AS_TENSOR:
            reached.append(type(args[0]))
        return call(self, func, args, kwargs)

    monkeypatch.setattr(Recorder, "call", counted)
    torch.manual_seed(0)
    w = torch.randn(3, dtype=torch.float64, requires_grad=True)
    items = [
        (torch.randn(3), np.random.default_rng(k).normal(size=3), torch.randn(3).double())
        for k in range(4)
    ]
    leaves = [leaf.requires_grad_() for _, _, leaf in items]
    got, stats = bf.batch_map(
        lambda i: _arrays(w, i), items, scheduler=scheduler, return_stats=True
    )
    got_grads = torch.autograd.grad(torch.stack([g[0] for g in got]).sum(), [w, *leaves])
    eager = [_arrays(w, i) for i in items]
    eager_grads = torch.autograd.grad(torch.stack([e[0] for e in eager]).sum(), [w, *leaves])
    for g, e in zip(
        flat_tensors([got, got_grads]), flat_tensors([eager, eager_grads]), strict=True
    ):
        assert g.dtype == e.dtype and g.requires_grad == e.requires_grad
        torch.testing.assert_close(g, e)
    assert reached == [list] * len(items)  # tensors and arrays took the short path
    assert stats.plan is not None and stats.steps < stats.nodes


def test_torch_tensor_in_another_thread_during_batch_map_is_a_tensor() -> None:
    made: list[object] = []

    def fn(x: int) -> torch.Tensor:
        other = threading.Thread(target=lambda: made.append(torch.tensor(x)))
        other.start()
        other.join()
        return torch.tensor(x) * 2

    got = bf.batch_map(fn, [1, 2])
    assert [type(t) for t in made] == [torch.Tensor, torch.Tensor]
    assert [int(t) for t in got] == [2, 4]


def test_a_mode_of_the_users_inside_batch_map_still_sees_the_calls() -> None:
    seen = []

    class Spy(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
            seen.append(func)
            return func(*args, **(kwargs or {}))

    def fn(x: torch.Tensor) -> torch.Tensor:
        with Spy():
            return F.relu(torch.as_tensor(x)) * 2

    got = bf.batch_map(fn, [torch.tensor([-1.0, 2.0]), torch.tensor([3.0, -4.0])])
    assert F.relu in seen
    torch.testing.assert_close(got[1], torch.tensor([6.0, 0.0]))


def _repeated_calls(x: torch.Tensor) -> Any:
    """Calls of lazy positional arguments only, made again and again: after the first, each
    takes the recorder's short path for calls whose signature exists."""
    a = torch.as_tensor(x) * 1
    b = a * 2
    c = torch.sin(a) + b  # short path once its signature exists
    with torch.no_grad():
        d = torch.sin(a) + b  # the same ops in another grad mode: their own signatures
    c.mul_(b)  # in place, of lazy arguments only
    e = torch.mul(c, torch.sigmoid(d))
    return e, d, a


def test_the_short_path_for_known_calls_keeps_grad_modes_views_and_writes() -> None:
    torch.manual_seed(0)
    items = [torch.randn(4, dtype=torch.float64, requires_grad=True) for _ in range(5)]
    assert_matches_eager(_repeated_calls, items)
    got = bf.batch_map(_repeated_calls, items)
    assert all(e.requires_grad and not d.requires_grad for e, d, _ in got)  # as eagerly

    def through_a_view(item: tuple[torch.Tensor, bool]) -> torch.Tensor:
        a = torch.as_tensor(item[0]) * 1
        view = a.view_as(a)  # a view: never on the short path, so marked in every instance
        if item[1]:
            view.add_(a)  # only after the first instance made the view's signature
        return a

    with pytest.raises(bf.UnsupportedOpError, match="writes into a view"):
        bf.batch_map(through_a_view, [(x, i > 0) for i, x in enumerate(items)])


def test_random_ops_on_the_short_path_draw_per_instance() -> None:
    p = [torch.full((64,), 0.5, dtype=torch.float64) for _ in range(6)]
    draws = bf.batch_map(lambda q: torch.bernoulli(torch.as_tensor(q)), p)
    # the same signature for every instance after the first: one step, fresh draws per row
    assert len({tuple(d.tolist()) for d in draws}) == len(p)
    assert all(set(d.tolist()) <= {0.0, 1.0} for d in draws)


def test_feature_alpha_dropout_drops_an_instances_own_channels() -> None:
    # stacked, [n, 1, C, T] took the instance for the channel: all its channels or none
    items = [torch.ones(40, 7, dtype=torch.float64) for _ in range(4)]
    channels = bf.batch_map(
        lambda x: F.feature_alpha_dropout(torch.as_tensor(x)[None], 0.5, True), items
    )
    for out in channels:  # [1, 40, 7]: a channel is dropped whole, and not every one alike
        assert (out == out[..., :1]).all() and len(set(out[0, :, 0].tolist())) == 2
    rows = bf.batch_map(lambda x: F.feature_alpha_dropout(torch.as_tensor(x), 0.5, True), items)
    for out in rows:  # [40, 7] is a batch of 40 features, each element dropped on its own
        assert int((out == out[:, :1]).all(1).sum()) < 40


@pytest.mark.parametrize("how", ["set_default_device", "with torch.device"])
def test_a_default_device_places_what_an_instance_makes_as_eager(how: str) -> None:
    from torch.utils._device import _device_constructors

    # the factories a default device redirects are cached on first use: empty, they are filled
    # inside the next batch_map, where torch.tensor is the short path's stand-in
    _device_constructors.cache_clear()

    def fn(x: int) -> list[torch.Tensor]:
        made = [torch.tensor(x), torch.tensor(x * 0.5) * 2, torch.zeros(2) + x, torch.arange(3)]
        given = [torch.as_tensor(torch.ones(2) * x), torch.as_tensor(np.full(2, x * 1.0))]
        return [*made, *given]  # the instance's CPU tensor and array are moved, as eager does

    def run() -> list[Any]:
        if how == "set_default_device":
            torch.set_default_device("meta")
            try:
                return [bf.batch_map(fn, [1, 2, 3]), [fn(x) for x in [1, 2, 3]]]
            finally:
                torch.set_default_device(None)
        with torch.device("meta"):
            return [bf.batch_map(fn, [1, 2, 3]), [fn(x) for x in [1, 2, 3]]]

    got, want = run()
    for g, w in zip(flat_tensors(got), flat_tensors(want), strict=True):
        assert g.device == w.device == torch.device("meta") and g.shape == w.shape
        assert g.dtype == w.dtype
    plain = bf.batch_map(fn, [1, 2])  # no default device: the CPU again, as eager
    assert {t.device.type for t in flat_tensors(plain)} == {"cpu"}
    torch.testing.assert_close(plain, [fn(1), fn(2)])


def test_a_users_own_wrapper_of_a_stood_in_function_stays_and_is_called(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_seed, real_tensor = torch.manual_seed, torch.tensor
    seeds: list[int] = []

    def counted_seed(seed: int) -> Any:
        seeds.append(seed)
        return real_seed(seed)

    monkeypatch.setattr(torch, "tensor", lambda *a, **k: real_tensor(*a, **k) * 2)  # changed
    monkeypatch.setattr(torch, "manual_seed", counted_seed)
    w = torch.randn(3, 4, dtype=torch.float64)
    changed = torch.tensor

    def loss(item: tuple[torch.Tensor, int]) -> torch.Tensor:
        return F.cross_entropy(torch.as_tensor(item[0]) @ w, torch.tensor(item[1]) // 2)

    items = [(torch.randn(3, dtype=torch.float64), label) for label in (0, 1, 2, 3)]
    got = bf.batch_map(loss, items)  # the labels doubled, then halved: as eagerly
    torch.testing.assert_close(got, [loss(item) for item in items], rtol=0, atol=0)
    assert torch.tensor is changed and torch.manual_seed is counted_seed
    with pytest.raises(bf.UnsupportedOpError, match="manual_seed"):  # refused inside, as ever
        bf.batch_map(lambda x: torch.manual_seed(0), [1])
    assert torch.manual_seed is counted_seed and not seeds
    torch.manual_seed(3)
    assert seeds == [3]
