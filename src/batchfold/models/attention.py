"""Feed-forward attention (Raffel and Ellis 2016) over sequences of vectors, as code and as blocks.

Raffel and Ellis, "Feed-forward networks with attention can solve some long-term memory
problems" (ICLR workshop 2016), reduce a sequence of states ``h_1 .. h_T`` to one vector
with a learned score per step and no recurrence::

    e_t = a(h_t) = v . tanh(W h_t + b)      alpha = softmax(e)      c = sum_t alpha_t h_t

:class:`FeedForwardAttention` holds ``a``'s weights. It computes ``c`` for one sequence
(``[T, dim]``) in :meth:`~FeedForwardAttention.forward`, plain PyTorch that runs eagerly or
inside ``batchfold.batch_map``, and :func:`feed_forward_attention` builds the same
computation as a block over a sequence of vectors, from existing combinators, on the same
weights: ``Map`` scores every step, ``Max`` and ``Sum`` make the softmax's shift and
normaliser, ``Zip`` with a ``Broadcast`` pairs each step with them. Sequences of any
length, 1 included, batch together in the block.

:class:`AttentionClassifier` is the paper's whole model: a per-step layer, the attention,
and an MLP on ``c``; :func:`attention_classifier_blocks` is the classifier as blocks.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from batchfold.blocks import (
    Block,
    Broadcast,
    Composition,
    Function,
    Identity,
    Map,
    Max,
    Record,
    Sum,
    Vector,
    Zip,
)

__all__ = [
    "AttentionClassifier",
    "FeedForwardAttention",
    "attention_classifier_blocks",
    "feed_forward_attention",
]


class FeedForwardAttention(nn.Module):
    """Raffel and Ellis's attention: scores ``v . tanh(W h_t + b)``, softmax, weighted sum.

    Arguments:
        dim: the size of each step's vector ``h_t``.
        hidden: the size of the scoring layer ``W``.

    Example:
        >>> attention = FeedForwardAttention(4, 3)
        >>> h = torch.randn(5, 4)
        >>> c = attention(h)
        >>> c.shape, torch.allclose(c, attention.weights(h) @ h)
        (torch.Size([4]), True)
    """

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.dim = dim
        self.score_layer = nn.Linear(dim, hidden)
        self.score_vector = nn.Linear(hidden, 1, bias=False)

    def score(self, h: Tensor) -> Tensor:
        """``e = v . tanh(W h + b)`` of each step: ``[..., dim]`` -> ``[...]``."""
        return self.score_vector(torch.tanh(self.score_layer(h))).squeeze(-1)

    def weights(self, h: Tensor) -> Tensor:
        """The attention weights ``alpha`` of one sequence ``[T, dim]``: ``[T]``, summing to 1."""
        return torch.softmax(self.score(h), dim=0)

    def forward(self, h: Tensor) -> Tensor:
        """The context ``c = sum_t alpha_t h_t`` of one sequence ``[T, dim]`` (``T >= 1``): ``[dim]``."""
        if h.dim() != 2 or h.shape[0] < 1 or h.shape[1] != self.dim:
            raise ValueError(
                f"feed-forward attention takes one sequence [T >= 1, {self.dim}], got shape "
                f"{list(h.shape)}"
            )
        return (self.weights(h).unsqueeze(-1) * h).sum(dim=0)


def _shifted_exp(e: Tensor, top: Tensor) -> Tensor:
    return torch.exp(e - top)


def _scale(weight: Tensor, h: Tensor) -> Tensor:
    return weight.unsqueeze(-1) * h


def _divide(total: Tensor, norm: Tensor) -> Tensor:
    return total / norm.unsqueeze(-1)


def feed_forward_attention(
    attention: FeedForwardAttention | int, hidden: int | None = None
) -> Block:
    """Feed-forward attention as a block: a sequence of vectors ``[dim]`` -> the context ``[dim]``.

    The softmax is shifted by the sequence's largest score, as ``torch.softmax`` shifts it,
    so long sequences and large scores do not overflow. An empty sequence has no context
    (its softmax divides 0 by 0, giving NaN): give sequences of length >= 1.

    Arguments:
        attention: the :class:`FeedForwardAttention` whose weights to use, or ``dim`` to
            make a new one (then ``hidden`` is needed).
        hidden: the scoring layer's size, when ``attention`` is a size.

    Returns:
        The block; a new module's weights are registered when the block is compiled.

    Example:
        >>> from batchfold.blocks import Map, Vector, compile
        >>> attention = FeedForwardAttention(3, 5)
        >>> model = compile(Map(Vector(3)) >> feed_forward_attention(attention))
        >>> seqs = [torch.randn(n, 3) for n in (1, 4, 2)]
        >>> contexts, _ = model([list(s) for s in seqs])
        >>> torch.allclose(contexts, torch.stack([attention(s) for s in seqs]), atol=1e-6)
        True
    """
    if isinstance(attention, int):
        if hidden is None:
            raise ValueError("feed_forward_attention(dim, hidden) needs hidden with a size")
        attention = FeedForwardAttention(attention, hidden)
    score = Function(attention.score, name="attention_score")
    shifted_exp = Function(_shifted_exp, name="shifted_exp")
    scale = Function(_scale, name="attention_scale")
    divide = Function(_divide, name="attention_normalise")

    def wiring(steps: Any) -> Any:
        scores = Map(score).reads(steps)
        top = Max().reads(scores)
        weights = (Record((Identity(), Broadcast())) >> Zip() >> Map(shifted_exp)).reads(
            scores, top
        )
        weighted = (Zip() >> Map(scale)).reads(weights, steps)
        return divide.reads(Sum().reads(weighted), Sum().reads(weights))

    return Composition(wiring, name="feed_forward_attention")


class AttentionClassifier(nn.Module):
    """Raffel and Ellis's model: ``h_t = relu(W x_t + b)``, attention, then an MLP on ``c``.

    Arguments:
        in_dim: the size of each input step ``x_t``.
        dim: the size of ``h_t`` and of the context.
        hidden: the size of the attention's scoring layer and of the MLP's hidden layer.
        n_outputs: the number of outputs (class logits, or 1 for a regression).

    Example:
        >>> model = AttentionClassifier(2, 8, 4, 3)
        >>> model(torch.randn(7, 2)).shape
        torch.Size([3])
    """

    def __init__(self, in_dim: int, dim: int, hidden: int, n_outputs: int) -> None:
        super().__init__()
        self.in_dim = in_dim
        self.step = nn.Linear(in_dim, dim)
        self.attention = FeedForwardAttention(dim, hidden)
        self.hidden_layer = nn.Linear(dim, hidden)
        self.output = nn.Linear(hidden, n_outputs)

    def encode(self, x: Tensor) -> Tensor:
        """``h_t = relu(W x_t + b)`` of each step: ``[..., in_dim]`` -> ``[..., dim]``."""
        return torch.relu(self.step(x))

    def head(self, c: Tensor) -> Tensor:
        """The outputs from a context: ``[..., dim]`` -> ``[..., n_outputs]``."""
        return self.output(torch.relu(self.hidden_layer(c)))

    def forward(self, x: Tensor) -> Tensor:
        """The outputs for one sequence ``[T >= 1, in_dim]``: ``[n_outputs]``.

        Plain single-instance code: it runs eagerly or inside ``batchfold.batch_map``.
        """
        return self.head(self.attention(self.encode(x)))


def attention_classifier_blocks(model: AttentionClassifier) -> Block:
    """:class:`AttentionClassifier` as a block on a sequence of input steps, on its weights.

    Each step is a vector of ``in_dim`` numbers (a list, array or tensor).

    Arguments:
        model: the classifier whose weights to use.

    Returns:
        A block giving the outputs ``[n_outputs]``; compile it with
        ``batchfold.blocks.compile``.

    Example:
        >>> from batchfold.blocks import compile
        >>> model = AttentionClassifier(2, 6, 4, 3)
        >>> outputs, _ = compile(attention_classifier_blocks(model))([[[0.5, 1.0]], [[1.0, 0.0]] * 3])
        >>> outputs.shape
        torch.Size([2, 3])
    """
    dtype = model.output.weight.dtype
    encode = Function(model.encode, name="encode")
    return (
        Map(Vector(model.in_dim, dtype) >> encode)
        >> feed_forward_attention(model.attention)
        >> Function(model.head, name="head")
    )
