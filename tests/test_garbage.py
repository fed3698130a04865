"""batch_map leaves no reference cycles behind: what a run made is freed by reference counting.

A cycle through the graph (signatures, ragged macros, the recorder) left about a thousand
objects per call for the cyclic collector, and the collections this forced after every call
cost more than the run's scheduling. Each case counts what a full collection finds after one
call, with the collector saving what it frees.
"""

from __future__ import annotations

import gc
import random
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import batchfold as bf
from batchfold.models.attention import AttentionClassifier

# the recorder itself (with its driver and source maker) may stay in one small cycle; the
# graph, its signatures and pending buffers, and the per-call garbage of helpers may not
SMALL = 40


def _cyclic_garbage(run: Callable[[], Any]) -> Counter[str]:
    """The types of the objects a full collection frees after ``run()``."""
    run()  # first calls trace modules and make process-wide caches
    gc.collect()
    was = gc.get_debug()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        out = run()
        del out
        gc.collect()
        return Counter(type(o).__name__ for o in gc.garbage)
    finally:
        gc.set_debug(was)
        gc.garbage.clear()


@pytest.fixture
def collector_off() -> Iterator[None]:
    """Collections only when the test asks: a collection mid-run would hide what it frees."""
    enabled = gc.isenabled()
    gc.disable()
    yield
    if enabled:
        gc.enable()


def _attention_losses(scheduler: Any) -> Callable[[], Any]:
    rng = random.Random(0)
    model = AttentionClassifier(in_dim=3, dim=4, hidden=5, n_outputs=2)
    items = [(torch.randn(rng.randint(1, 9), 3), rng.randrange(2)) for _ in range(12)]

    def loss(item: tuple[torch.Tensor, int]) -> torch.Tensor:
        x, y = item
        return F.cross_entropy(model(torch.as_tensor(x)), torch.tensor(y))

    return lambda: bf.batch_map(loss, items, scheduler=scheduler)


def _decoding(scheduler: Any) -> Callable[[], Any]:
    embed, cell, out = nn.Embedding(4, 3), nn.GRUCell(3, 3), nn.Linear(3, 4)

    def decode(start: int) -> tuple[list[int], None]:
        h, token, tokens = torch.zeros(3), start, []
        while len(tokens) < 4:
            h = cell(embed(torch.tensor(token)), h)
            token = int(out(h).argmax())  # a sync point
            tokens.append(token)
        return tokens, None  # a result holding plain values, walked as a tree

    return lambda: bf.batch_map(decode, [0, 1, 2, 3], scheduler=scheduler)


def _plain_ops(scheduler: Any) -> Callable[[], Any]:
    lin = nn.Linear(3, 3)
    return lambda: bf.batch_map(
        lambda n: lin(torch.ones(n, 3)).relu().sum(0), [1, 2, 3, 2], scheduler=scheduler
    )


@pytest.mark.usefixtures("collector_off")
@pytest.mark.parametrize("case", [_attention_losses, _decoding, _plain_ops])
@pytest.mark.parametrize("scheduler", ["agenda", "depth"])
def test_a_batch_map_leaves_no_cycles_of_its_graph(
    case: Callable[[str], Callable[[], Any]], scheduler: str
) -> None:
    run = case(scheduler)
    with torch.no_grad() if case is _decoding else torch.enable_grad():
        found = _cyclic_garbage(run)
    for kind in ("Signature", "Pending", "RaggedMacro", "OpRule", "function", "cell"):
        assert found[kind] == 0, (kind, found.most_common(8))
    assert sum(found.values()) <= SMALL, found.most_common(8)
