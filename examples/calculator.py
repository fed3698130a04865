"""Learn the sign of arithmetic expressions from their trees, as blocks (TensorFlow Fold's
calculator).

An expression is a nested dict: ``{"op": "num", "value": 7}`` or
``{"op": "-", "left": ..., "right": ...}`` over digits 0-9 with ``+``, ``-`` and ``*``. A
recursive block embeds each number, combines the two children of each operator with a layer
of its own, and classifies the root as negative, zero or positive. Run with
``python examples/calculator.py``; it trains for a few seconds and prints test accuracy next
to the majority-class baseline.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from typing import Any

import torch
import torch.nn.functional as F

from batchfold.blocks import (
    FC,
    Concat,
    Embedding,
    ForwardDeclaration,
    GetItem,
    OneOf,
    PyObjectType,
    Record,
    Scalar,
    TensorType,
    compile,
)

OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
DIM = 48


def random_expression(rng: random.Random, depth: int) -> dict[str, Any]:
    """A random expression tree at most ``depth`` operators deep."""
    if depth == 0 or rng.random() < 0.25:
        return {"op": "num", "value": rng.randrange(10)}
    return {
        "op": rng.choice(list(OPS)),
        "left": random_expression(rng, depth - 1),
        "right": random_expression(rng, depth - 1),
    }


def evaluate(expr: dict[str, Any]) -> int:
    """The value of an expression."""
    if expr["op"] == "num":
        return expr["value"]
    return OPS[expr["op"]](evaluate(expr["left"]), evaluate(expr["right"]))


def sign_class(expr: dict[str, Any]) -> int:
    """0 for a negative value, 1 for zero, 2 for a positive one."""
    value = evaluate(expr)
    return 0 if value < 0 else 1 if value == 0 else 2


def build_model() -> Any:
    """The recursive block: an expression -> class logits of its value's sign."""
    expr = ForwardDeclaration(PyObjectType(), TensorType((DIM,)), name="expr")
    number = GetItem("value") >> Scalar("int64") >> Embedding(10, DIM)

    def operator() -> Any:
        children = Record({"left": expr(), "right": expr()})
        return children >> Concat() >> FC(2 * DIM, DIM, activation=torch.tanh)

    cases = {"num": number, **{op: operator() for op in OPS}}
    expr.resolve_to(OneOf(lambda e: e["op"], cases))
    return compile(expr() >> FC(DIM, 3, activation=None))


def accuracy(model: Any, exprs: list[dict[str, Any]]) -> float:
    """The fraction of expressions whose sign the model predicts."""
    with torch.no_grad():
        logits, _ = model(exprs)
    labels = torch.tensor([sign_class(e) for e in exprs])
    return (logits.argmax(-1) == labels).float().mean().item()


def main() -> None:
    """Train on random expressions, then report accuracy on new ones."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rng = random.Random(0)
    train = [random_expression(rng, 4) for _ in range(4000)]
    test = [random_expression(rng, 4) for _ in range(1000)]
    model = build_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    start = time.perf_counter()
    for epoch in range(8):
        rng.shuffle(train)
        for i in range(0, len(train), 50):
            batch = train[i : i + 50]
            logits, _ = model(batch)
            loss = F.cross_entropy(logits, torch.tensor([sign_class(e) for e in batch]))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch + 1}: test accuracy {accuracy(model, test):.3f}")
    counts = Counter(sign_class(e) for e in test)
    print(f"trained in {time.perf_counter() - start:.1f} s")
    print(f"majority-class baseline: {max(counts.values()) / len(test):.3f}")
    print(f"test set run: {model.last_stats}")


if __name__ == "__main__":
    main()
