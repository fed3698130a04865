"""PyTorch's Python-level functions reach the recorder on a shorter path inside ``batch_map``
(``batchfold.lazy.dispatch``): the same plan, values and gradients as PyTorch's own path and
as eager execution, and PyTorch's function back in place afterwards."""

from __future__ import annotations

import pytest
import torch
import torch._tensor
import torch.nn.functional as F
from torch import nn

import batchfold as bf
from batchfold.lazy import dispatch
from batchfold.lazy.kept import forget
from batchfold.schedule import Scheduler


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

    monkeypatch.setattr(dispatch, "handle", counted)
    torch.manual_seed(1)
    got, got_grads, got_plan = _run(model, items, scheduler)
    assert F.cross_entropy in calls and F.layer_norm in calls
    monkeypatch.setattr(dispatch, "handle", dispatch.ORIGINAL)  # PyTorch's own path
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

    bf.batch_map(lambda x: F.relu(torch.as_tensor(x)), [torch.ones(2)])
    with pytest.raises(ValueError, match="stop"):
        bf.batch_map(fails, [torch.ones(2)])
    for module in (F, torch.functional, torch._tensor):
        assert module.handle_torch_function is torch.overrides.handle_torch_function


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
