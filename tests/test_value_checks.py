"""Per-instance values that eager PyTorch reads inside an op, and checks: sizes given as 0-d
integer tensors, and indices that ``one_hot`` and ``index_fill`` check (their vmap rules do
not)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import batchfold as bf

XS = [torch.tensor([2.0, 1.0, 3.0]), torch.tensor([1.0, 3.0, 0.0]), torch.tensor([3.0, 0.0, 2.0])]

SIZED: dict[str, Callable[[Any, Any], Any]] = {  # (x, n): n a 0-d per-instance int64
    "zeros(n)": lambda x, n: torch.zeros(n) + x.sum(),
    "zeros((n, 2))": lambda x, n: torch.zeros((n, 2)) + x[0],
    "arange(n)": lambda x, n: torch.arange(n) * x[1],
    "full((n,), 1.5)": lambda x, n: torch.full((n,), 1.5) * x[2],
    "eye(n)": lambda x, n: torch.eye(n) * x[0],
    "new_ones(n, 2)": lambda x, n: x.new_ones(n, 2) * x[1],
    "expand(n, 3)": lambda x, n: x.expand(n, 3) * 2,
    "repeat(n)": lambda x, n: x.repeat(n),
    "narrow(0, 0, n)": lambda x, n: x.narrow(0, 0, n) + 1,
    "torch.narrow(x, 0, 0, n)": lambda x, n: torch.narrow(x, 0, 0, n) + 1,
    "select(0, n - 1)": lambda x, n: x.select(0, n - 1) * 3,
    "view(n, -1)": lambda x, n: x.repeat(2).view(n * 0 + 2, -1),
}


@pytest.mark.parametrize("case", sorted(SIZED))
def test_a_size_given_as_a_per_instance_integer_tensor_is_its_value(case: str) -> None:
    """Eager reads the value (``__index__``); recorded as it was, the op took its shape from
    a placeholder (``x.expand(n, 3)`` came back ``[0, 3]``) or failed to stack."""
    make = SIZED[case]

    def fn(x: Any) -> torch.Tensor:
        x = torch.as_tensor(x)
        return make(x, x[0].long())

    got, stats = bf.batch_map(fn, XS, return_stats=True)
    for g, x in zip(got, XS, strict=True):
        torch.testing.assert_close(g, fn(x))
    assert stats.syncs >= 1  # the size was read, as int(n) would be


def test_a_size_as_a_separate_argument_is_refused_by_pytorch_not_a_crash() -> None:
    """``torch.ones(n, 2)`` with ``n`` lazy: PyTorch's parser refuses an object with
    ``__torch_function__`` among separate sizes (a TypeError); its read inside the parser
    used to pause the instance there and crash the process when the next one got there."""

    def fn(x: Any) -> torch.Tensor:
        x = torch.as_tensor(x)
        return torch.ones(x[0].long(), 2)

    with pytest.raises(TypeError):
        bf.batch_map(fn, XS)
    # written with int(n), it batches
    got = bf.batch_map(lambda x: torch.ones(int(torch.as_tensor(x)[0]), 2), XS)
    assert [tuple(g.shape) for g in got] == [(2, 2), (1, 2), (3, 2)]


@pytest.mark.parametrize(
    ("indices", "error"),
    [
        ([[0, 1], [3, 5], [1, 1]], "smaller than num_classes"),
        ([[0, 1], [-1, 2], [1, 1]], "non-negative"),
        ([[0, 1], [3, 2], [1, 1]], None),
    ],
)
def test_one_hot_checks_every_instances_classes(indices: list[list[int]], error: str | None):
    """vmap's one_hot left an out-of-range class a row of zeros."""

    def fn(x: Any) -> torch.Tensor:
        return F.one_hot(torch.as_tensor(x), 4)

    xs = [torch.tensor(i) for i in indices]
    if error is not None:
        with pytest.raises(RuntimeError, match=error):
            bf.batch_map(fn, xs)
    else:
        for g, x in zip(bf.batch_map(fn, xs), xs, strict=True):
            torch.testing.assert_close(g, fn(x))


@pytest.mark.parametrize("in_place", [False, True])
def test_index_fill_reads_each_instances_own_indices(in_place: bool) -> None:
    """vmap's index_fill put a negative index's fill into another instance's row, and one
    out of range went unreported."""

    def fn(x: Any) -> torch.Tensor:
        index = torch.as_tensor(x)
        out = torch.zeros(4)
        return out.index_fill_(0, index, 3.0) if in_place else out.index_fill(0, index, 3.0)

    xs = [torch.tensor([0, 1]), torch.tensor([3, -2]), torch.tensor([1, 1])]
    for g, x in zip(bf.batch_map(fn, xs), xs, strict=True):
        torch.testing.assert_close(g, fn(x))
    with pytest.raises(IndexError, match="out of bounds"):
        bf.batch_map(fn, [torch.tensor([0, 1]), torch.tensor([3, 5])])


KEYWORD_FORMS: dict[str, Callable[[Any], Any]] = {
    "argmax(keepdim=True)": lambda x: x.argmax(keepdim=True),
    "argmin(x, dim=None, keepdim=True)": lambda x: torch.argmin(x, dim=None, keepdim=True),
    "sum(dim=None)": lambda x: torch.sum(x, dim=None) + x.amax(dim=None),
    "view(dtype=int64)": lambda x: x.view(dtype=torch.int64) % 7,
    "view(float32)": lambda x: x.view(torch.float32).nan_to_num(0.0, 0.0, 0.0).abs().sum(-1),
}


@pytest.mark.parametrize("case", sorted(KEYWORD_FORMS))
@pytest.mark.parametrize("lengths", [(3, 3, 3), (3, 1, 4)])
def test_reductions_over_everything_and_views_as_another_dtype(
    case: str, lengths: tuple[int, ...]
) -> None:
    """``argmax(keepdim=True)`` with no dim went to vmap, which gave the wrong rank; a view
    as another dtype was reshaped to the new shape in the old dtype."""
    make = KEYWORD_FORMS[case]
    gen = torch.Generator().manual_seed(len(case))
    xs = [torch.randn(n, 4, dtype=torch.float64, generator=gen) for n in lengths]

    def fn(x: Any) -> Any:
        return make(torch.as_tensor(x))

    for got, x in zip(bf.batch_map(fn, xs), xs, strict=True):
        torch.testing.assert_close(got, fn(x))


REFUSED: dict[str, Callable[[Any], Any]] = {
    "repeat_interleave(repeats=t)": lambda x: x.repeat_interleave(repeats=x.long(), dim=0),
    "repeat_interleave(counts)": lambda x: torch.repeat_interleave(x.long()),
    "where(condition=c)": lambda x: torch.where(condition=x > 1),
    "tensor_split(t)": lambda x: x.tensor_split(torch.tensor([1, 2]), dim=0)[0],
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_value_shaped_calls_by_keyword_are_refused_as_by_position(case: str) -> None:
    """The refusal read ``repeats`` and the split points by position only: by keyword these
    failed inside a batching rule ("a bug in batchfold's rule")."""
    make = REFUSED[case]
    for x in XS:
        make(x)  # eager runs

    with pytest.raises(bf.UnsupportedOpError, match="depends on per-instance values"):
        bf.batch_map(lambda x: make(torch.as_tensor(x)), XS)


def _same_values_and_grads(
    got: list[torch.Tensor], want: list[torch.Tensor], module: torch.nn.Module
) -> None:
    """Values equal, and the gradients of one weighted sum of each list w.r.t. the module's
    parameters (each output weighted by its place, so a swapped row shows)."""
    grads = []
    for outs in (got, want):
        total = sum((o * (i + 1)).sum() for i, o in enumerate(outs))
        assert isinstance(total, torch.Tensor)
        grads.append(torch.autograd.grad(total, list(module.parameters())))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    for g, w in zip(*grads, strict=True):
        torch.testing.assert_close(g, w)


def test_a_per_instance_table_is_looked_up_in_that_instance_alone() -> None:
    """vmap's embedding read a neighbour's row for an index out of a per-instance table
    (eager raises) and gave the padding row a gradient in all but one instance."""
    layer = torch.nn.Linear(2, 2).double()
    tables = [torch.randn(6, 2, dtype=torch.float64) for _ in range(3)]

    def fn(item: Any, padding: int | None = 2) -> torch.Tensor:
        table, index = item
        return F.embedding(torch.as_tensor(index), layer(torch.as_tensor(table)), padding)

    items = [(t, [0, 2, 5]) for t in tables]
    for padding in (2, -1, None):
        got = bf.batch_map(lambda item, p=padding: fn(item, p), items)
        _same_values_and_grads(got, [fn(item, padding) for item in items], layer)
    for bad in (6, -1):
        wrong = [(t, [0, bad] if i == 1 else [0, 1]) for i, t in enumerate(tables)]
        with pytest.raises(IndexError):
            bf.batch_map(fn, wrong)


def test_ctc_loss_takes_one_sequences_lengths_as_per_instance_tensors() -> None:
    gen = torch.Generator().manual_seed(0)
    items = [(torch.randn(5, 4, generator=gen), [1, 2], 5, 2), (torch.randn(5, 4), [3, 3], 4, 2)]

    def fn(item: Any) -> torch.Tensor:
        scores, target, frames, length = (torch.as_tensor(v) for v in item)
        return F.ctc_loss(scores.log_softmax(-1), target, frames, length)

    for g, item in zip(bf.batch_map(fn, items), items, strict=True):
        torch.testing.assert_close(g, fn(item))


@pytest.mark.parametrize("cell_type", [torch.nn.GRUCell, torch.nn.RNNCell, torch.nn.LSTMCell])
def test_recurrent_cells_with_a_state_or_input_from_outside(cell_type: type) -> None:
    """The cells' rule folded every input's batch into the cell's batch, a shared state's
    too (a step-0 state made outside the function): "a bug in batchfold's rule"."""
    torch.manual_seed(0)
    cell = cell_type(4, 5).double()
    h0, c0 = torch.randn(5, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    lstm = cell_type is torch.nn.LSTMCell

    def state(h: torch.Tensor) -> Any:
        return (h, c0 if h.dim() == 1 else c0[None]) if lstm else h

    cases = [
        lambda x: cell(x, state(h0)),  # the state from outside
        lambda x: cell(h0[:4], state(x.repeat(2)[:5])),  # the input from outside
        lambda x: cell(x[None], state(h0[None])),  # a batch of one
    ]
    xs = [torch.randn(4, dtype=torch.float64) for _ in range(3)]
    for case in cases:

        def fn(x: Any, case: Any = case) -> torch.Tensor:
            out = case(torch.as_tensor(x))
            return torch.cat(out) if isinstance(out, tuple) else out

        for g, x in zip(bf.batch_map(fn, xs), xs, strict=True):
            torch.testing.assert_close(g, fn(x))


def test_ops_vmap_would_run_past_autocast_run_once_each_under_it() -> None:
    """Under autocast vmap ran conv1d and addmm without autocast's casts (float32 where eager
    gives bfloat16: "a bug in batchfold's rule")."""
    torch.manual_seed(0)
    conv, weight, bias = torch.nn.Conv1d(2, 5, 3), torch.randn(3, 3), torch.randn(3)
    xs = [torch.randn(2, 5) for _ in range(3)]

    def fn(x: Any) -> torch.Tensor:
        x = torch.as_tensor(x)
        product = torch.addmm(bias, x[:, :3].repeat(2, 1)[:3], weight)
        return torch.cat([conv(x[None]).flatten(), product.flatten()])

    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, want = bf.batch_map(fn, xs), [fn(x) for x in xs]
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype == torch.bfloat16
        torch.testing.assert_close(g, w)


def test_writes_through_views_as_another_dtype_of_an_items_memory_are_refused() -> None:
    """``torch.as_tensor(x).real.mul_(2)`` changes the caller's ``x`` eagerly; it was neither
    applied nor refused (only views of the same dtype counted as the item's memory)."""
    xs = [torch.tensor([1 + 1j, 2 - 1j]) * (i + 1) for i in range(3)]
    floats = [torch.tensor([1.0, 2.0]) + i for i in range(3)]
    writes: list[tuple[Callable[[Any], Any], list[torch.Tensor]]] = [
        (lambda x: torch.as_tensor(x).real.mul_(2), xs),
        (lambda x: torch.as_tensor(x).imag.add_(1), xs),
        (lambda x: torch.view_as_real(torch.as_tensor(x)).mul_(2), xs),
        (lambda x: torch.as_tensor(x).view(torch.int32).add_(1), floats),
    ]
    for write, items in writes:
        with pytest.raises(bf.UnsupportedOpError, match="instance's own tensor"):
            bf.batch_map(lambda x, write=write: write(x).sum(), items)
    # read, not written: as eagerly
    got = bf.batch_map(lambda x: torch.as_tensor(x).imag * 2, xs)
    for g, x in zip(got, xs, strict=True):
        torch.testing.assert_close(g, x.imag * 2)


def test_numpy_arrays_of_lazy_values_are_read_only() -> None:
    """Eager ``t.numpy()`` shares ``t``'s memory, so a write into it changes ``t``; the array of
    a lazy value was a copy, written unseen."""

    def fn(x: Any) -> torch.Tensor:
        t = torch.as_tensor(x) * 2
        t.numpy()[0] = 7.0
        return t + 1

    with pytest.raises(ValueError, match="read-only"):
        bf.batch_map(fn, XS)
    got = bf.batch_map(lambda x: float(np.asarray(torch.as_tensor(x) * 2).sum()), XS)
    assert got == [float((x * 2).sum()) for x in XS]


def test_a_leaf_made_like_a_lazy_tensor_is_a_leaf_and_sparse_items_are_refused() -> None:
    """``zeros_like(x, requires_grad=True)`` is eagerly a leaf that backward fills; it came
    back a row of a batched value that required no grad. A sparse item crashed inside
    PyTorch."""

    def fn(x: Any) -> tuple[torch.Tensor, torch.Tensor]:
        leaf = torch.full_like(torch.as_tensor(x), 0.5, requires_grad=True)
        return leaf, (leaf * torch.as_tensor(x)).sum()

    for outs in (bf.batch_map(fn, XS), [fn(x) for x in XS]):
        torch.stack([total for _, total in outs]).sum().backward()
        for (leaf, total), x in zip(outs, XS, strict=True):
            assert leaf.is_leaf and leaf.requires_grad and total.requires_grad
            torch.testing.assert_close(leaf.grad, x)
    sparse = [torch.eye(2).to_sparse() * (i + 1) for i in range(3)]
    with pytest.raises(bf.UnsupportedOpError, match="sparse"):
        bf.batch_map(lambda x: torch.as_tensor(x).to_dense(), sparse)
    dense = bf.batch_map(lambda x: torch.as_tensor(x) * 2, [s.to_dense() for s in sparse])
    assert all(torch.equal(d, s.to_dense() * 2) for d, s in zip(dense, sparse, strict=True))


def test_a_size_read_inside_a_module_call_is_recorded_op_by_op_as_eager() -> None:
    """A module whose forward reads a size from its input cannot be one cached call (the read
    is a sync point); the read runs everything so far at once, inside the trace, and the
    call's ops are recorded one by one: values and gradients as eager, under no_grad too."""
    lin = torch.nn.Linear(3, 3).double()

    class Pad(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            rows: Any = x[0, 0].abs().long() + 1  # a 0-d tensor where PyTorch takes an int
            return torch.cat([lin(x), torch.zeros((rows, 3), dtype=x.dtype)])

    pad = Pad()
    gen = torch.Generator().manual_seed(3)
    xs = [torch.randn(2, 3, dtype=torch.float64, generator=gen) * 3 for _ in range(4)]

    def fn(x: Any) -> torch.Tensor:
        rows: Any = torch.as_tensor(x)[1, 1].abs().long() + 1
        with torch.no_grad():
            extra = torch.as_tensor(x).new_ones(rows, 3)
        return torch.cat([pad(torch.as_tensor(x)), extra])

    got, stats = bf.batch_map(fn, xs, return_stats=True)
    want = [fn(x) for x in xs]
    assert stats.module_calls_cached == 0
    assert all(g.requires_grad and w.requires_grad for g, w in zip(got, want, strict=True))
    _same_values_and_grads(got, want, lin)


@pytest.mark.parametrize(
    ("dtype", "number", "error"), [(torch.int8, 300, RuntimeError), (None, 2**64, ValueError)]
)
def test_a_number_out_of_its_dtypes_range_raises_eagers_error_naming_the_line(
    dtype: torch.dtype | None, number: int, error: type[Exception]
) -> None:
    """The batch's numbers are converted at once: the error came without the line or value."""
    fn = lambda x: torch.tensor(x, dtype=dtype) * 2  # noqa: E731
    with pytest.raises(error) as eager:
        [fn(x) for x in [1, number]]
    with pytest.raises(error) as batched:
        bf.batch_map(fn, [1, number])
    assert str(batched.value) == str(eager.value)
    assert any(
        "test_value_checks.py" in note and repr(number) in note
        for note in getattr(batched.value, "__notes__", [])
    )
