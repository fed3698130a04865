"""What a Function block refuses, and what it no longer gets wrong: callables told apart by
identity, code that is not row-wise, BatchNorm in training, writes into inputs, plans whose
per-instance steps went stale, weights moved to another dtype; and Mean and lossy input casts
against eager PyTorch."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from torch import nn

from batchfold.blocks import (
    AllOf,
    FromTensor,
    Function,
    Identity,
    Map,
    Mean,
    Metric,
    Record,
    Scalar,
    Sum,
    Vector,
    compile,
)
from batchfold.blocks.compiler import CompiledModel
from batchfold.errors import BatchfoldError, UnsupportedOpError

pytestmark = pytest.mark.usefixtures("float64")


@dataclasses.dataclass(frozen=True)
class _Head:
    """A callable whose tensor field takes no part in ``==``, as tensors break equality."""

    name: str
    weight: torch.Tensor = dataclasses.field(compare=False)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.t()


@dataclasses.dataclass
class _Scale:  # eq=True without frozen: not hashable
    k: float

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.k


def test_callables_that_compare_equal_are_two_ops() -> None:
    a, b = _Head("head", torch.ones(1, 2)), _Head("head", torch.full((1, 2), 10.0))
    assert a == b
    model = compile(Record((Vector(2) >> Function(a), Vector(2) >> Function(b))))
    (ya, yb), _ = model([([1.0, 2.0], [1.0, 2.0])])
    x = torch.tensor([[1.0, 2.0]])
    torch.testing.assert_close(ya, a(x), rtol=0, atol=1e-12)
    torch.testing.assert_close(yb, b(x), rtol=0, atol=1e-12)


def test_an_unhashable_callable_compiles() -> None:
    model = compile(Map(Scalar() >> Function(_Scale(2.0))) >> Sum())
    out, _ = model([[1.0, 2.0], [3.0]])
    torch.testing.assert_close(out, torch.tensor([6.0, 6.0]), rtol=0, atol=0)


def test_a_bound_method_used_twice_is_one_op() -> None:
    lin = nn.Linear(2, 2)
    model = compile(
        Record((Vector(2) >> Function(lin.forward), Vector(2) >> Function(lin.forward)))
    )
    assert len([s for s in model._specs if s.name == "forward"]) == 1


def test_code_that_is_not_row_wise_is_refused_at_compile() -> None:
    with pytest.raises(BatchfoldError, match=r"s\[:, None\]"):
        compile(Record((Vector(2), Scalar())) >> Function(lambda a, s: a * s))
    model = compile(Record((Vector(2), Scalar())) >> Function(lambda a, s: a * s[:, None]))
    data = [([1.0, 1.0], 2.0), ([1.0, 1.0], 3.0)]
    out, _ = model(data)
    want = torch.stack([torch.tensor(a) * s for a, s in data])
    torch.testing.assert_close(out, want, rtol=0, atol=0)


def test_batchnorm_in_training_is_refused_and_runs_in_eval() -> None:
    norm = nn.BatchNorm1d(2)
    model = compile(Map(Vector(2) >> Function(norm)) >> Sum())
    data = [[[1.0, 2.0], [3.0, 5.0]], [[100.0, -7.0]]]
    with pytest.raises(UnsupportedOpError, match="BatchNorm"):
        model(data)
    assert norm.num_batches_tracked is not None and norm.running_mean is not None
    assert norm.num_batches_tracked.item() == 0
    norm.running_mean.copy_(torch.tensor([1.0, -1.0]))
    norm.eval()
    out, _ = model(data)
    want = torch.stack([norm(torch.tensor(x)).sum(0) for x in data])
    torch.testing.assert_close(out, want, rtol=0, atol=1e-12)


def test_a_function_that_writes_into_its_input_is_refused() -> None:
    def double_(x: torch.Tensor) -> torch.Tensor:
        return x.mul_(2)

    model = compile(Vector(2) >> AllOf(Function(double_), Function(torch.neg)))
    with pytest.raises(UnsupportedOpError, match="writes into its inputs"):
        model([[1.0, 2.0], [3.0, 4.0]])


def test_mean_of_a_long_half_precision_sequence_divides_as_eager() -> None:
    for n in (2049, 3001, 66_000):
        xs = [1.0] * (n - 1) + [float(n)] if n < 65_504 else [2.0**-10] * n
        got, _ = compile(Map(Scalar("float16")) >> Mean())([xs])
        total, _ = compile(Map(Scalar("float16")) >> Sum())([xs])
        want = total[0] / len(xs)
        assert got.dtype == torch.float16
        torch.testing.assert_close(got[0], want, rtol=0, atol=0)


def test_lossy_tensor_inputs_are_refused_as_numbers_are() -> None:
    with pytest.raises(BatchfoldError, match="real numbers"):
        compile(Scalar())([torch.tensor(1 + 2j)])
    with pytest.raises(BatchfoldError, match="integers"):
        compile(Scalar(torch.bool))([torch.tensor(0.5)])
    out, _ = compile(Scalar(torch.bool))([torch.tensor(1.0), torch.tensor(0)])
    assert out.tolist() == [True, False]
    out, _ = compile(Scalar(torch.complex128))([torch.tensor(2.0)])
    assert out.tolist() == [2 + 0j]


def _per_instance_model() -> tuple[nn.Linear, CompiledModel]:
    lin = nn.Linear(2, 3)
    function = Function(lambda x: x @ (lin.weight * 2).t(), per_instance=True, modules=[lin])
    return lin, compile(Map(Vector(2) >> function) >> Sum())


DATA = [[[1.0, 2.0], [3.0, 4.0]], [[0.5, -1.0]]]


def test_a_plan_of_per_instance_steps_runs_in_the_state_it_was_scheduled_in() -> None:
    lin, model = _per_instance_model()
    plan = model.schedule(DATA)
    got, _ = model.run(plan)
    rows = [[torch.tensor(x) @ (lin.weight * 2).t() for x in xs] for xs in DATA]
    want = torch.stack([torch.stack(r).sum(0) for r in rows])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("change", ["weights", "grad mode", "eval", "copy"])
def test_a_plan_of_per_instance_steps_is_refused_once_the_model_changed(change: str) -> None:
    lin, model = _per_instance_model()
    if change == "grad mode":
        with torch.no_grad():
            plan = model.schedule(DATA)
    else:
        plan = model.schedule(DATA)
    if change == "weights":
        with torch.no_grad():
            lin.weight.add_(0.25)
    elif change == "eval":
        model.eval()
    runner = copy.deepcopy(model) if change == "copy" else model
    with pytest.raises(ValueError, match="per-instance code"):
        runner.run(plan)


def test_weights_moved_to_another_dtype_after_compile_are_refused() -> None:
    model = compile(Vector(3) >> Function(nn.Linear(3, 2)))
    model.float()
    with pytest.raises(ValueError, match="not the dtype it was compiled with"):
        model([[1.0, 2.0, 3.0]])


def test_a_per_instance_plan_that_only_reads_weights_runs_after_an_optimizer_step() -> None:
    """Ops that read a weight read it when the plan runs: only values computed from the weights
    alone (``W * 2``) are constants of the plan, and only those make it stale."""
    lin = nn.Linear(2, 3)
    f = Function(lambda x: torch.tanh(x @ lin.weight.t()), per_instance=True, modules=[lin])
    model = compile(Map(Vector(2) >> f) >> Sum())
    plans = [model.schedule(DATA), model.schedule(DATA)]
    for plan in plans:
        got, _ = model.run(plan)
        rows = [[torch.tanh(torch.tensor(x) @ lin.weight.t()) for x in xs] for xs in DATA]
        want = torch.stack([torch.stack(r).sum(0) for r in rows])
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
        with torch.no_grad():
            lin.weight.add_(0.25)


def test_a_buffer_added_after_compile_is_no_dtype_change() -> None:
    """The dtypes were compared position by position: a new buffer raised StopIteration."""
    lin = nn.Linear(3, 2)
    model = compile(Vector(3) >> Function(lin))
    lin.register_buffer("calls", torch.zeros((), dtype=torch.int64))
    out, _ = model([[1.0, 2.0, 3.0]])
    torch.testing.assert_close(out, lin(torch.tensor([[1.0, 2.0, 3.0]])), rtol=0, atol=1e-12)


def test_only_a_batchnorm_that_runs_on_batch_statistics_is_refused() -> None:
    norm = nn.BatchNorm1d(2)
    declared = compile(Map(Vector(2) >> Function(lambda h: h * 1.0, modules=[norm])) >> Sum())
    out, _ = declared([[[1.0, 2.0]], [[3.0, 4.0]]])  # declared, never called: nothing to refuse
    assert out.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    batch_stats = nn.BatchNorm1d(2, track_running_stats=False).eval()  # the batch's, in eval
    model = compile(Map(Vector(2) >> Function(batch_stats)) >> Sum())
    with pytest.raises(UnsupportedOpError, match="statistics of its batch"):
        model([[[1.0, 2.0], [3.0, 5.0]], [[100.0, -7.0]]])


def test_outputs_and_metrics_are_tensors_of_their_own() -> None:
    """Rows in order were views of their step's output: a write into one output changed
    another output and a metric, and broke the backward pass."""
    lin = nn.Linear(2, 2)
    model = compile(Vector(2) >> Function(lin) >> AllOf(Identity(), Identity(), Metric("m")))
    (a, b, _), metrics = model([[1.0, 2.0], [3.0, 4.0]])
    before_b, before_m = b.clone(), metrics["m"].clone()
    a.mul_(2)
    assert torch.equal(b, before_b) and torch.equal(metrics["m"], before_m)
    (a.sum() + 3 * b.sum()).backward()
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert lin.weight.grad is not None
    torch.testing.assert_close(lin.weight.grad, (5 * torch.ones(2, 2, dtype=x.dtype)) * x.sum(0))


def test_a_parameter_assigned_anew_is_what_from_tensor_reads() -> None:
    """``load_state_dict(..., assign=True)`` replaces the parameter: the block read the old one."""
    weight = nn.Parameter(torch.zeros(2))
    model = compile(Record((FromTensor(weight), FromTensor(torch.zeros(2)))))
    state = {k: torch.ones_like(v) for k, v in model.state_dict().items()}
    model.load_state_dict(state, assign=True)
    (got, _), _ = model([(None, None)])
    assert got.tolist() == [[1.0, 1.0]]
    got.sum().backward()
    assert next(model.parameters()).grad is not None


def test_a_per_instance_plan_made_in_a_dataloader_worker_is_refused_there() -> None:
    """Its plan cannot be pickled back: the worker's feeder thread printed the error and the
    loader waited forever."""
    from torch.utils.data import DataLoader

    _, model = _per_instance_model()
    loader = DataLoader(DATA, batch_size=2, num_workers=1, collate_fn=model.schedule)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match="DataLoader worker"):
        next(iter(loader))


def test_a_block_that_reads_no_wires_takes_no_input() -> None:
    """``reads()`` gave it an empty tuple, which FromTensor and Zeros refused as an input."""
    from batchfold.blocks import Composition

    model = compile(Composition(lambda x: FromTensor(torch.ones(2)).reads()))
    out, _ = model([1, 2])
    assert out.tolist() == [[1.0, 1.0], [1.0, 1.0]]


def test_an_optional_whose_some_case_has_no_zeros_names_itself() -> None:
    """A bare ValueError from Zeros, naming no block, came out at compile."""
    from batchfold.blocks import Optional

    with pytest.raises(BatchfoldError, match=r"Optional\(Identity\(\)\) at model"):
        compile(Optional(Identity()))
