"""Property test: random per-instance programs give eager's values, dtypes and gradients.

A program is a list of instructions over a few registers of one instance. Instructions mix
what has gone silently wrong before: grad-mode blocks, in-place writes seen through Python
aliases, item assignment, ops on shared tensors (memoised, or changed by matmul with a 3-d
weight), tensor arguments passed by keyword, and 0-d operands of other dtypes. Branches on
the Python input make instances differ in structure. Random ops are checked apart, for
independence, since their values cannot match eager's.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import batchfold as bf
from reference import assert_matches_eager

DIM = 4
REGISTERS = 3
KINDS = [
    "tanh",
    "add",
    "mul_kw",
    "linear",
    "no_grad_linear",
    "enable_grad_block",
    "iadd_alias",
    "method_in_place",
    "relu_inplace",
    "setitem",
    "shared_memo",
    "matmul_3d",
    "zero_d_float32",
    "zero_d_int",
    "sum_kw",
    "branch",
    "pick",
    "views",
    "where",
    "masked_fill",
    "clamp_pow",
    "max_dim",
    "chunk_cat",
    "gather",
    "expand",
    "einsum",
    "softmaxes",
    "sort_amax",
    "sign_detach",
    "as_tensor_write",
    "returns_itself",
]


class Shared(nn.Module):
    """The shared tensors a program may use."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(DIM, DIM)
        self.w3 = nn.Parameter(torch.randn(2, DIM, DIM) * 0.5)
        self.scale = nn.Parameter(torch.randn(DIM))


def run(program: list[tuple[str, int, int]], x: tuple[float, ...], shared: Shared) -> Any:
    """One instance of ``program`` on input ``x``: plain PyTorch code."""
    t = torch.tensor(x)
    regs = [t, t * 0.5, torch.sin(t)]
    extras = []
    for kind, a, b in program:
        ra, rb = regs[a], regs[b]
        if kind == "tanh":
            regs[a] = torch.tanh(rb)
        elif kind == "add":
            regs[a] = ra + rb
        elif kind == "mul_kw":
            regs[a] = torch.mul(input=ra, other=torch.sigmoid(rb))
        elif kind == "linear":
            regs[a] = shared.lin(rb).tanh()
        elif kind == "no_grad_linear":
            with torch.no_grad():
                target = shared.lin(rb)
            regs[a] = ra * target
        elif kind == "enable_grad_block":
            with torch.no_grad():
                with torch.enable_grad():
                    inner = shared.lin(ra)
                regs[a] = inner + rb
        elif kind == "iadd_alias":  # clone: eager autograd may need the old value
            alias = regs[a] = ra.clone()
            regs[b] = alias  # two registers, one object: a write shows through both
            alias += torch.cos(rb)
        elif kind == "method_in_place":
            regs[a] = ra.clone()
            regs[a].mul_(0.5).add_(rb)
        elif kind == "relu_inplace":
            regs[a] = ra.clone()
            F.relu(regs[a], inplace=True)
        elif kind == "setitem":
            regs[a] = ra.clone()
            regs[a][b % DIM] = rb.sum()
        elif kind == "shared_memo":
            regs[a] = ra * shared.scale.exp() + shared.lin.weight.t().sum(0)
        elif kind == "matmul_3d":
            regs[a] = (rb @ shared.w3).sum(0)
        elif kind == "zero_d_float32":  # eagerly float32: the 0-d float64 yields
            regs[a] = (rb.float() * torch.tensor(1.5, dtype=torch.float64)).double() + ra
        elif kind == "zero_d_int":  # eagerly int32: the 0-d int64 yields
            extras.append((ra * 10).int() + torch.tensor(b + 1))
        elif kind == "sum_kw":
            regs[a] = ra + torch.sum(input=rb, dim=0, keepdim=True)
        elif kind == "pick":  # a position that differs per instance (negative at times)
            regs[a] = ra + rb[int(abs(x[1]) * 7) % DIM - (b % 2) * DIM]
        elif kind == "branch" and x[0] > 0:  # instances differ in structure
            regs[a] = torch.sigmoid(ra) * rb
        elif kind == "views":  # reshapes, a transpose and a per-instance matmul of them
            regs[a] = (ra.view(2, 2).t() @ torch.tanh(rb).reshape(2, 2)).flatten()
        elif kind == "where":
            regs[a] = torch.where(rb > 0, ra, -0.5 * ra)
        elif kind == "masked_fill":
            regs[a] = ra.masked_fill(rb < 0, 0.25) * rb
        elif kind == "clamp_pow":
            regs[a] = rb.clamp(-1.0, 1.0).pow(2) + ra
        elif kind == "max_dim":  # values and integer indices
            values, index = rb.max(0)
            regs[a] = ra * values + index.to(ra.dtype)
        elif kind == "chunk_cat":
            first, second = ra.chunk(2)
            regs[a] = torch.cat([second * rb[0], first])
        elif kind == "gather":  # a per-instance index tensor
            index = torch.tensor([(i * (b + 1) + a) % DIM for i in range(DIM)])
            regs[a] = rb.gather(0, index) + ra
        elif kind == "expand":
            regs[a] = ra + rb[b % DIM :][:1].expand(DIM)
        elif kind == "einsum":
            regs[a] = torch.tanh(torch.einsum("i,ij->j", rb, shared.w3[a % 2]))
        elif kind == "softmaxes":
            regs[a] = F.log_softmax(ra, 0) * torch.softmax(rb, 0)
        elif kind == "sort_amax":
            regs[a] = torch.sort(rb, stable=True).values * 0.5 + ra.amax(0, keepdim=True)
        elif kind == "sign_detach":
            regs[a] = ra.abs() * rb.sign() + rb.detach() * ra
        elif kind == "as_tensor_write":  # as_tensor gives the tensor itself: the write shows
            regs[a] = ra.clone()
            torch.as_tensor(regs[a]).mul_(0.5).add_(rb)
        elif kind == "returns_itself":  # calls eager answers with their input
            regs[a] = torch.atleast_1d(+ra.cpu().positive().resolve_conj()).conj() * rb
    return [*regs, shared.lin(regs[0]), *extras]  # every program reaches the parameters


instruction = st.tuples(
    st.sampled_from(KINDS), st.integers(0, REGISTERS - 1), st.integers(0, REGISTERS - 1)
)
vector = st.tuples(*[st.floats(-2.0, 2.0, allow_nan=False) for _ in range(DIM)])


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
@settings(max_examples=40, deadline=None)
@given(
    program=st.lists(instruction, min_size=1, max_size=12),
    xs=st.lists(vector, min_size=1, max_size=5),
)
def test_random_programs_match_eager(
    scheduler: str, program: list[tuple[str, int, int]], xs: list[tuple[float, ...]]
) -> None:
    shared = Shared()
    assert_matches_eager(lambda x: run(program, x, shared), xs, shared, scheduler)  # type: ignore[arg-type]


RANDOM_OPS = {
    "dropout_shared": lambda t, h: F.dropout(h, 0.5, training=True) * t.sum(),
    "dropout_lazy": lambda t, h: F.dropout(t.expand(64, DIM), 0.5, training=True),
    "bernoulli_shared": lambda t, h: torch.bernoulli(h * 0.5) + t.sum(),
    "rand_like_lazy": lambda t, h: torch.rand_like(t.expand(64, DIM)),
    "randn_factory": lambda t, h: torch.randn(64, DIM) + t,
}


@pytest.mark.parametrize("op", list(RANDOM_OPS))
@settings(max_examples=5, deadline=None)
@given(calls=st.integers(1, 3), count=st.integers(2, 4))
def test_random_ops_draw_independently_per_instance_and_call(
    op: str, calls: int, count: int
) -> None:
    shared = torch.ones(64, DIM)
    fn = RANDOM_OPS[op]
    outs = bf.batch_map(lambda _: [fn(torch.ones(DIM), shared) for _ in range(calls)], range(count))
    draws = [d for per_instance in outs for d in per_instance]
    for i, a in enumerate(draws):
        for b in draws[i + 1 :]:
            assert not torch.equal(a, b)
