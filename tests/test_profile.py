"""The profiler: per-signature times and sizes, without changing values or gradients."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import batchfold as bf
from batchfold.blocks import Function, Map, Scalar, Sum, compile
from reference import flat_tensors, loss_of

pytestmark = pytest.mark.usefixtures("float64")


def _model() -> tuple[nn.Module, Any]:
    lin = nn.Linear(3, 3)

    def fn(n: int) -> torch.Tensor:
        h = torch.ones(3) * n
        for _ in range(n):
            h = torch.tanh(lin(h))
        return h.sum()

    return lin, fn


def test_profiling_changes_no_value_or_gradient() -> None:
    lin, fn = _model()
    xs = [1, 3, 2, 4]
    plain = bf.batch_map(fn, xs)
    grads = torch.autograd.grad(loss_of(plain), list(lin.parameters()))
    profiled, stats = bf.batch_map(fn, xs, return_stats=True, profile=True)
    assert stats.profile is not None
    got = torch.autograd.grad(loss_of(profiled), list(lin.parameters()))
    for a, b in zip(
        flat_tensors(profiled) + list(got), flat_tensors(plain) + list(grads), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_the_profile_covers_every_step_and_times_the_backward_pass() -> None:
    lin, fn = _model()
    outs, stats = bf.batch_map(fn, [1, 3, 2, 4], return_stats=True, profile=True)
    profile = stats.profile
    assert profile is not None and stats.plan is not None
    rows = profile.rows()
    assert sum(r["steps"] for r in rows) == len(stats.plan.steps)
    assert sum(r["nodes"] for r in rows) == stats.nodes
    assert all(r["backward_ms"] == 0 for r in rows)
    torch.stack(outs).sum().backward()
    assert sum(r["backward_ms"] for r in profile.rows()) > 0
    assert set(profile.phase_rows()) == {"record", "schedule", "execute", "backward"}
    text = str(profile)
    assert text.splitlines()[0].split()[:3] == ["signature", "steps", "nodes"]
    assert "phases: record" in text and "linear" in text


@pytest.mark.filterwarnings("ignore:.*Profiler clears events")  # torch 2.11 warns, 2.13 not
def test_steps_show_by_name_in_a_torch_profiler_trace() -> None:
    _, fn = _model()
    with torch.profiler.profile() as prof:
        bf.batch_map(fn, [1, 2, 3], profile=True)
    names = {event.name for event in prof.events() or []}
    assert any(name.startswith("bf:linear x") for name in names), sorted(names)[:20]


def test_blocks_models_profile_too() -> None:
    double = Function(lambda x: x * 2)
    model = compile(Map(Scalar() >> double) >> Sum())
    outputs, _ = model([[1.0, 2.0], [3.0]], profile=True)
    torch.testing.assert_close(outputs, torch.tensor([6.0, 6.0]))
    assert model.last_stats is not None and model.last_stats.profile is not None
    assert sum(r["nodes"] for r in model.last_stats.profile.rows()) == model.last_stats.nodes
