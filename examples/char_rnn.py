"""Classify synthetic sentences with a hierarchical RNN: characters -> words -> sentence.

A sentence is a few random lower-case words; some end in ``ly`` and some in ``ed``. Its
label says whether the ``ly`` words outnumber the ``ed`` words, so the model has to read the
characters of every word (a character GRU per word gives the word's vector) and count across
the sentence (a word GRU over those vectors). Nested sequences are plain blocks: ``Map`` over
words of ``Map`` over characters. Run with ``python examples/char_rnn.py``.
"""

from __future__ import annotations

import random
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from batchfold.blocks import (
    FC,
    RNN,
    Embedding,
    Function,
    GetItem,
    InputTransform,
    Map,
    Scalar,
    TensorType,
    TupleType,
    compile,
)

CHARS, HIDDEN = 16, 32
STEM_LETTERS = "abcfghijkmnopqrstuvwxz"  # no 'l', 'y', 'e' or 'd': only suffixes make them


def gru(in_size: int, hidden: int) -> Function:
    """A GRU cell as an RNN cell block: ``(x, h) -> (h', h')``."""
    cell = nn.GRUCell(in_size, hidden)

    def step(x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = cell(x, h)
        return h, h

    in_type = TupleType(TensorType((in_size,)), TensorType((hidden,)))
    return Function(step, in_type=in_type, modules=[cell], name="gru")


def build_model() -> Any:
    """Sentence (a string) -> two class logits."""
    char = Scalar("int64") >> Embedding(26, CHARS)
    letters = InputTransform(lambda word: [ord(c) - ord("a") for c in word], name="letters")
    word = letters >> Map(char) >> RNN(gru(CHARS, HIDDEN)) >> GetItem(1)
    sentence = InputTransform(str.split) >> Map(word) >> RNN(gru(HIDDEN, HIDDEN)) >> GetItem(1)
    return compile(sentence >> FC(HIDDEN, 2, activation=None))


def random_sentence(rng: random.Random) -> tuple[str, int]:
    """A sentence and its label: 1 when more words end in ``ly`` than in ``ed``."""
    while True:
        words = []
        for _ in range(rng.randint(3, 7)):
            stem = "".join(rng.choice(STEM_LETTERS) for _ in range(rng.randint(1, 4)))
            words.append(stem + rng.choice(["", "", "ly", "ed"]))
        ly = sum(w.endswith("ly") for w in words)
        ed = sum(w.endswith("ed") for w in words)
        if ly != ed:
            return " ".join(words), int(ly > ed)


def accuracy(model: Any, data: list[tuple[str, int]]) -> float:
    """The fraction of sentences classified right."""
    with torch.no_grad():
        logits, _ = model([s for s, _ in data])
    return (logits.argmax(-1) == torch.tensor([y for _, y in data])).float().mean().item()


def main() -> None:
    """Train for a few epochs and report test accuracy."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rng = random.Random(0)
    train, test = (
        [random_sentence(rng) for _ in range(3000)],
        [random_sentence(rng) for _ in range(500)],
    )
    print(f"e.g. {train[0][0]!r} -> {train[0][1]}; {train[1][0]!r} -> {train[1][1]}")
    model = build_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    start = time.perf_counter()
    for epoch in range(6):
        rng.shuffle(train)
        for i in range(0, len(train), 50):
            batch = train[i : i + 50]
            logits, _ = model([s for s, _ in batch])
            loss = F.cross_entropy(logits, torch.tensor([y for _, y in batch]))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch + 1}: test accuracy {accuracy(model, test):.3f}")
    print(
        f"trained in {time.perf_counter() - start:.1f} s; majority class: "
        f"{max(sum(y for _, y in test), sum(1 - y for _, y in test)) / len(test):.3f}"
    )
    print(f"test set run: {model.last_stats}")


if __name__ == "__main__":
    main()
