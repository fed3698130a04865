"""Layers: ``nn.Module`` s that also compose as blocks (``FC``, ``Embedding``).

A layer is a batched module (batch dimension first). Where a block is expected it becomes a
``Function`` whose input type is the layer's ``block_in_type``; any other ``nn.Module``
becomes a ``Function`` the same way. Its weights are shared wherever it is used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .combinators import Pipe
from .convert import convert_to_block
from .types import TensorType


class _Layer(nn.Module):
    """``>>`` for modules: ``layer >> block`` and ``block >> layer`` make a ``Pipe``."""

    def __rshift__(self, other: Any) -> Any:
        return Pipe(self, other)

    def __rrshift__(self, other: Any) -> Any:
        return Pipe(other, self)

    def reads(self, *wires: Any) -> Any:
        """Wire this layer inside a ``Composition`` (see ``Block.reads``)."""
        return convert_to_block(self).reads(*wires)


class FC(_Layer):
    """A fully connected layer ``activation(W dropout(x) + b)`` on vectors of ``in_features``.

    Arguments:
        in_features: the input size.
        out_features: the output size.
        activation: applied to the output (``None`` for none); ReLU by default.
        dropout: the dropout probability on the input (active in training mode).
        bias: whether the layer has a bias.

    Example:
        >>> from batchfold.blocks import Vector
        >>> fc = FC(2, 3, activation=None)
        >>> out = (Vector(2) >> fc).eval([1.0, -1.0])
        >>> torch.allclose(out, fc.linear(torch.tensor([1.0, -1.0])))
        True
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        activation: Callable[[torch.Tensor], torch.Tensor] | None = torch.relu,
        dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=bias)
        self.dropout: nn.Module = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.activation = activation

    @property
    def block_in_type(self) -> TensorType:
        """The input type as a block: a vector of ``in_features``."""
        return TensorType((self.linear.in_features,), self.linear.weight.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``activation(W dropout(x) + b)`` for ``x`` of shape ``[..., in_features]``."""
        y = self.linear(self.dropout(x))
        return self.activation(y) if self.activation is not None else y

    def extra_repr(self) -> str:
        name = getattr(self.activation, "__name__", repr(self.activation))
        return f"{self.linear.in_features}, {self.linear.out_features}, activation={name}"


class Embedding(_Layer):
    """Integer ids -> vectors, optionally from a pretrained matrix (such as GloVe vectors).

    Arguments:
        num_embeddings: the number of ids.
        embedding_dim: the vector size.
        initializer: a ``[num_embeddings, embedding_dim]`` tensor or array to start from.
        trainable: whether the vectors are trained.
        mod_inputs: take ids modulo ``num_embeddings`` (TensorFlow Fold's default); when
            false an out-of-range id is an error.

    Example:
        >>> from batchfold.blocks import Scalar
        >>> emb = Embedding(3, 2, initializer=torch.arange(6.0).reshape(3, 2))
        >>> (Scalar("int64") >> emb).eval(4).tolist()
        [2.0, 3.0]
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        initializer: torch.Tensor | np.ndarray | None = None,
        trainable: bool = True,
        mod_inputs: bool = True,
    ) -> None:
        super().__init__()
        if initializer is None:
            weight = torch.randn(num_embeddings, embedding_dim)
        else:
            weight = torch.as_tensor(initializer, dtype=torch.get_default_dtype()).clone()
            if tuple(weight.shape) != (num_embeddings, embedding_dim):
                raise ValueError(
                    f"initializer has shape {tuple(weight.shape)}, expected "
                    f"({num_embeddings}, {embedding_dim})"
                )
        self.weight = nn.Parameter(weight, requires_grad=trainable)
        self.mod_inputs = mod_inputs

    @property
    def block_in_type(self) -> TensorType:
        """The input type as a block: one int64 id."""
        return TensorType((), torch.int64)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """The vectors of ``ids`` (any shape of int64), ``[*ids.shape, embedding_dim]``."""
        if self.mod_inputs:
            ids = ids.remainder(self.weight.shape[0])
        return F.embedding(ids, self.weight)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, {self.weight.shape[1]}"


__all__ = ["FC", "Embedding"]
