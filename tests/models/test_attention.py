"""Feed-forward attention: the block equals the per-instance code, eager and through batch_map."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
import torch

import batchfold as bf
from batchfold.blocks import Map, Vector, compile
from batchfold.models.attention import (
    AttentionClassifier,
    FeedForwardAttention,
    attention_classifier_blocks,
    feed_forward_attention,
)

pytestmark = pytest.mark.usefixtures("float64")


def sequences(n: int, dim: int, seed: int = 0) -> list[torch.Tensor]:
    rng = random.Random(seed)
    lengths = [1, 1, 2] + [rng.randint(1, 9) for _ in range(n - 3)]
    return [torch.randn(length, dim) for length in lengths]


def assert_same(params: Sequence[torch.Tensor], got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    weights = torch.randn_like(want)
    got_grads = torch.autograd.grad((got * weights).sum(), params)
    want_grads = torch.autograd.grad((want * weights).sum(), params)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


@pytest.mark.usefixtures("walks")
@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_the_block_equals_the_per_instance_form(scheduler: str):
    torch.manual_seed(0)
    attention = FeedForwardAttention(4, 3)
    seqs = [s.requires_grad_() for s in sequences(12, 4)]
    block = compile(Map(Vector(4)) >> feed_forward_attention(attention), scheduler=scheduler)  # type: ignore[arg-type]
    got, _ = block([list(s.unbind(0)) for s in seqs])
    want = torch.stack([attention(s) for s in seqs])
    assert_same([*attention.parameters(), *seqs], got, want)


def test_the_classifier_blocks_equal_eager_and_batch_map():
    torch.manual_seed(1)
    model = AttentionClassifier(2, 5, 4, 3)
    seqs = sequences(15, 2, seed=1)
    got, _ = compile(attention_classifier_blocks(model))([s.tolist() for s in seqs])
    params = list(model.parameters())
    assert_same(params, got, torch.stack([model(s) for s in seqs]))
    lazy = torch.stack(bf.batch_map(lambda s: model(torch.as_tensor(s)), seqs))
    assert_same(params, lazy, torch.stack([model(s) for s in seqs]))


def test_a_new_module_from_sizes_is_registered_when_compiled():
    block = compile(Map(Vector(3)) >> feed_forward_attention(3, 2))
    assert sum(p.numel() for p in block.parameters()) == 3 * 2 + 2 + 2
    with pytest.raises(ValueError, match="needs hidden"):
        feed_forward_attention(3)


def test_weights_are_a_softmax_and_large_scores_do_not_overflow():
    torch.manual_seed(2)
    attention = FeedForwardAttention(2, 3)
    with torch.no_grad():
        attention.score_vector.weight.mul_(1e4)  # scores far beyond exp's range
    h = torch.randn(6, 2)
    alpha = attention.weights(h)
    torch.testing.assert_close(alpha.sum(), torch.tensor(1.0))
    got, _ = compile(Map(Vector(2)) >> feed_forward_attention(attention))([list(h.unbind(0))])
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got[0], attention(h))


def test_one_step_attends_to_itself():
    attention = FeedForwardAttention(3, 2)
    h = torch.randn(1, 3)
    torch.testing.assert_close(attention(h), h[0])


@pytest.mark.parametrize("shape", [(0, 3), (3,), (2, 4)])
def test_bad_sequences_name_the_shape(shape: tuple[int, ...]):
    with pytest.raises(ValueError, match=r"one sequence \[T >= 1, 3\]"):
        FeedForwardAttention(3, 2)(torch.zeros(shape))
