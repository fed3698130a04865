"""``batch_map``'s results are tensors a caller can write in place, as eager results are: a
write into one result changes it alone, and the gradients are eager's. Results that required
grad were views ``unbind`` made of the batched outputs, which autograd refuses to see written
in place (a crash where the eager code runs), and a write would have reached the batch's other
rows. One value returned twice comes back as one tensor, as eagerly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import batchfold as bf
from batchfold.schedule import Scheduler

pytestmark = pytest.mark.usefixtures("float64")

LENGTHS = [3, 1, 4, 3, 2]  # ragged: rows of several lengths, two of the same


def _instances() -> list[list[list[float]]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(n, 4, generator=g).tolist() for n in LENGTHS]


def _functions(layer: nn.Linear) -> dict[str, Callable[[Any], Any]]:
    def rows(x: Any) -> Any:
        return torch.tanh(layer(torch.tensor(x))) * 2.0  # a result no op saved for backward

    return {
        "rows": rows,  # ragged: packed rows
        "a row": lambda x: rows(x)[0],  # one shape: rows of a batched step
        "a number": lambda x: rows(x).sum(),
        "a tuple": lambda x: (rows(x)[-1], len(x)),
    }


def _writes() -> dict[str, Callable[[torch.Tensor], object]]:
    return {
        "add_": lambda t: t.add_(1.0),
        "mul_": lambda t: t.mul_(3.0),
        "item assignment": lambda t: t.__setitem__(..., 0.5),
    }


def _run(fn: str, write: Callable[[torch.Tensor], object], batched: bool, **kw: Any) -> Any:
    torch.manual_seed(0)
    layer = nn.Linear(4, 4)
    f = _functions(layer)[fn]
    xs = _instances()
    results = bf.batch_map(f, xs, **kw) if batched else [f(x) for x in xs]
    tensors = [r[0] if isinstance(r, tuple) else r for r in results]
    write(tensors[1])  # one instance's result, written after batch_map returned
    loss = torch.stack([(t * (i + 1)).sum() for i, t in enumerate(tensors)]).sum()
    loss.backward()
    return [t.detach() for t in tensors], [p.grad for p in layer.parameters()]


@pytest.mark.parametrize("write", list(_writes()))
@pytest.mark.parametrize("fn", ["rows", "a row", "a number", "a tuple"])
@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_a_result_written_in_place_changes_it_alone_as_eagerly(
    fn: str, write: str, scheduler: Scheduler
) -> None:
    do = _writes()[write]
    want, want_grads = _run(fn, do, batched=False)
    got, got_grads = _run(fn, do, batched=True, scheduler=scheduler)
    for g, w in zip(got + got_grads, want + want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)


def test_a_value_returned_twice_is_one_tensor() -> None:
    layer = nn.Linear(4, 4)

    def twice(x: Any) -> Any:
        h = layer(torch.tensor(x))
        return h, h, h.sum()

    for mode in (torch.enable_grad, torch.no_grad):
        with mode():
            results = bf.batch_map(twice, _instances())
        for h, again, total in results:
            assert h is again
            h.add_(1.0)  # eagerly, again is h: it changes too
            torch.testing.assert_close(again, h)
            assert total.data_ptr() != h.data_ptr()


def test_a_compiled_block_evaluated_on_one_input_gives_writable_results() -> None:
    from batchfold.blocks import Function, Map, Scalar, compile

    layer = nn.Linear(1, 2)
    model = compile(Map(Scalar(torch.float64) >> Function(lambda x: layer(x[:, None]))))
    out = model.evaluate([1.0, 2.0])
    out[0].add_(1.0)
    sum(t.sum() for t in out).backward()  # type: ignore[union-attr]
    want = [layer(torch.tensor([x])) for x in (1.0, 2.0)]
    torch.testing.assert_close(out[0], want[0] + 1.0)
    torch.testing.assert_close(out[1], want[1])
    torch.testing.assert_close(layer.weight.grad, torch.tensor([[3.0], [3.0]]))


@pytest.mark.parametrize("kind", ["tensor", "tensor requiring grad", "array"])
def test_a_result_that_is_an_instances_own_tensor_eagerly_is_that_tensor(kind: str) -> None:
    import numpy as np

    layer = nn.Linear(3, 2)

    def make() -> list[Any]:
        g = torch.Generator().manual_seed(0)
        xs = [torch.randn(3, generator=g) for _ in range(3)]
        if kind == "array":
            return [x.numpy() for x in xs]
        return [x.requires_grad_(kind == "tensor requiring grad") for x in xs]

    def fn(x: Any) -> Any:
        t = torch.as_tensor(x)  # no conversion: eagerly x's memory, or x itself
        return t, layer(t)

    runs = []
    for batched in (False, True):
        xs = make()
        results = bf.batch_map(fn, xs) if batched else [fn(x) for x in xs]
        for x, (t, _) in zip(xs, results, strict=True):
            assert t is x if isinstance(x, torch.Tensor) else np.shares_memory(t.numpy(), x)
        loss = torch.stack([(t * 3).sum() + out.sum() for t, out in results]).sum()
        if kind == "tensor requiring grad":  # x's gradient: from t itself and from the layer
            loss.backward()
        else:
            results[0][0].mul_(2.0)  # eagerly, x itself doubles
        runs.append(
            [torch.as_tensor(x).detach().clone() for x in xs]
            + [x.grad for x in xs if isinstance(x, torch.Tensor) and x.grad is not None]
        )
    for g, w in zip(runs[1], runs[0], strict=True):
        torch.testing.assert_close(g, w)


def _shared_results(layer: nn.Linear) -> dict[str, Callable[[Any], Any]]:
    return {
        "made from a weight": lambda x: (layer(torch.tensor(x)), layer.weight * 2.0),
        "a view of a weight": lambda x: (layer(torch.tensor(x)), layer.weight.T),
        "shared only": lambda x: (layer.bias + 1.0, layer.weight * 3.0),
    }


@pytest.mark.parametrize("kind", ["made from a weight", "a view of a weight", "shared only"])
def test_a_result_computed_from_shared_tensors_is_each_instances_own(kind: str) -> None:
    """A call on shared tensors runs once and every instance got that one tensor: a write
    into one instance's result reached the others' (silently)."""
    runs = []
    for batched in (False, True):
        torch.manual_seed(0)
        layer = nn.Linear(3, 2)
        fn = _shared_results(layer)[kind]
        xs = [[1.0, 2.0, 3.0], [0.5, -1.0, 2.0], [0.0, 1.0, 1.0]]
        results = bf.batch_map(fn, xs) if batched else [fn(x) for x in xs]
        assert results[0][1] is not results[1][1]
        with torch.no_grad():
            results[0][1].add_(0.0 if kind == "a view of a weight" else 1.0)  # a weight's view
        torch.stack([r.sum() for inst in results for r in inst]).sum().backward()
        runs.append([r.detach() for inst in results for r in inst] + [layer.weight.grad])
    for g, w in zip(runs[1], runs[0], strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)


def test_a_leaf_made_inside_and_returned_is_that_leaf() -> None:
    """``torch.zeros(2, requires_grad=True)`` returned came back as a row of the batched
    constants, not a leaf, and backward left its ``.grad`` empty (silently)."""

    def fn(x: float) -> Any:
        z = torch.zeros(2, requires_grad=True)
        return z, (z * x).sum()

    for results in ([fn(x) for x in (1.0, 2.0)], bf.batch_map(fn, [1.0, 2.0])):
        torch.stack([loss for _, loss in results]).sum().backward()
        for (z, _), x in zip(results, (1.0, 2.0), strict=True):
            assert z.is_leaf
            torch.testing.assert_close(z.grad, torch.full((2,), x))


def test_results_made_in_grad_mode_inside_a_no_grad_batch_map_are_written_as_eagerly() -> None:
    """``batch_map`` under ``no_grad``, values made under ``enable_grad`` inside: they require
    grad, are their own tensors (a layer's output and a weight's multiple alike), and a write
    into one instance's leaves the others' and the gradients as eagerly."""
    xs = [[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]]
    runs = []
    for batched in (False, True):
        torch.manual_seed(0)
        layer = nn.Linear(3, 3)

        def fn(x: list[float], layer: nn.Linear = layer) -> Any:
            with torch.enable_grad():
                return layer(torch.tensor(x)) * 2, layer.weight * 3, layer(torch.tensor(x)) + 0

        with torch.no_grad():
            results = bf.batch_map(fn, xs) if batched else [fn(x) for x in xs]
            results[0][0].add_(1.0)
            results[0][1].add_(1.0)
        torch.stack([r.sum() for inst in results for r in inst]).sum().backward()
        runs.append([r.detach() for inst in results for r in inst] + [layer.weight.grad])
        assert all(r.requires_grad for inst in results for r in inst)
    for g, w in zip(runs[1], runs[0], strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)
