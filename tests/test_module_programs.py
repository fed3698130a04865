"""Property test: random chains of calls of random modules give eager's values, gradients and
``requires_grad``, cached or not.

A module computes a few values from its arguments (one reads a weight, one only its inputs, one
only some of them, one none of them, one reads the weight without grad) and returns a random
mix of them and of its arguments as they are, flat or nested. An instance calls it several
times, each call on what earlier ones returned, positionally or by keyword, some calls without
grad, so that the cached calls of a step read inputs with and without grad; some calls take a
tensor from outside (a bias) as an argument, and some writes go in place into what a call
returned. Found before: outputs of a cached call that eager gives ``requires_grad=False`` came
back requiring grad; a value a cached call returns twice came back as two objects, so that a
write into one did not show in the other.
"""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import nn

import batchfold as bf
from batchfold.lazy.kept import forget
from reference import assert_matches_eager

NEW = 5  # the values a module computes


class Mixed(nn.Module):
    """Returns ``returns``: ``("arg", k)`` its argument ``k`` as it is, ``("new", j)`` the
    value ``j`` it computes; the first one alone, the rest in a tuple if ``nested``."""

    def __init__(self, returns: list[tuple[str, int]], nested: bool) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3).double()
        self.returns, self.nested = returns, nested

    def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> Any:
        with torch.no_grad():
            frozen = self.lin(b) * 2  # never requires grad
        new = [torch.tanh(self.lin(a + c)), a * b, torch.sigmoid(b), torch.ones_like(a), frozen]
        args = (a, b, c)
        outs = [args[k] if kind == "arg" else new[k] for kind, k in self.returns]
        return (outs[0], tuple(outs[1:])) if self.nested and len(outs) > 1 else tuple(outs)


def _flat(out: Any) -> list[Any]:
    """The values of nested tuples, in order (lazy tensors inside ``batch_map``)."""
    return [v for item in out for v in _flat(item)] if isinstance(out, tuple) else [out]


_RETURN = st.one_of(
    st.tuples(st.just("arg"), st.integers(0, 2)), st.tuples(st.just("new"), st.integers(0, NEW - 1))
)


@settings(max_examples=30, deadline=None)
@given(
    returns=st.lists(_RETURN, min_size=1, max_size=4),
    nested=st.booleans(),
    calls=st.lists(
        st.tuples(st.booleans(), st.booleans(), st.booleans(), st.integers(0, 9)),
        min_size=1,
        max_size=5,
    ),
    count=st.integers(1, 5),
    rows=st.booleans(),
    alias_first=st.booleans(),
    scheduler=st.sampled_from(["agenda", "depth"]),
)
def test_random_module_chains_match_eager(
    returns: list[tuple[str, int]],
    nested: bool,
    calls: list[tuple[bool, bool, bool, int]],
    count: int,
    rows: bool,
    alias_first: bool,
    scheduler: str,
) -> None:
    torch.manual_seed(0)
    module = Mixed(returns, nested)

    def fn(x: torch.Tensor) -> list[torch.Tensor]:
        a = torch.as_tensor(x) * 1  # its own memory: eagerly as_tensor would be x itself
        # three objects, or one of them twice: a first call with one value at two argument
        # positions once became a template that later calls, with two values, misread
        values = [a, a, a + 1] if alias_first else [a, a * 2, a + 1]
        got: list[torch.Tensor] = []
        for positional, grad, feed, pick in calls:
            if pick == 9:  # a tensor from outside as an argument
                values = [values[0], module.lin.bias, values[2]]
            with torch.set_grad_enabled(grad):  # positional: the cache's short path
                out = module(*values) if positional else module(values[0], values[1], c=values[2])
            flat = _flat(out)
            if pick == 8 and not flat[0].requires_grad and flat[0] is not module.lin.bias:
                flat[0].mul_(3)  # in place on a returned value (maybe an argument, as eagerly)
            got += flat
            # the next call's arguments: new objects made from what this one returned, or the
            # same objects as before in another order (then some may be what it handed back)
            if feed:
                values = [flat[(pick + i) % len(flat)] * 1 for i in range(3)]
            else:
                values = [values[(pick + i) % 3] for i in range(3)]
        return got

    # vectors, or sequences of rows of any length (0 included): calls on sequences are cached
    # as ragged macros, one node per call whatever its length
    shapes = [(i % 4, 3) if rows else (3,) for i in range(count)]
    items = [torch.randn(shape, dtype=torch.float64) for shape in shapes]
    eager = [t for x in items for t in fn(x) if t.requires_grad]
    needs = bool(eager)
    if needs:  # a write into a value the backward pass needs: eager refuses it there
        try:
            loss = torch.stack([t.sum() for t in eager]).sum()
            torch.autograd.grad(loss, [*module.parameters()], allow_unused=True)
        except RuntimeError as error:
            assume("modified by an inplace operation" not in str(error))
            raise
    forget()  # each example traces its module itself
    try:
        assert_matches_eager(fn, items, module if needs else None, scheduler)  # type: ignore[arg-type]
    except bf.UnsupportedOpError as error:  # a write into a tensor from outside, refused
        # (a result several calls share, or one a recorded op reads before the write)
        assume("calls got" not in str(error) and "changed in place before" not in str(error))
        raise
