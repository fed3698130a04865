"""Feed-forward attention on Raffel and Ellis's addition problem, through ``batch_map``.

Each sequence has 5 to 12 steps ``(value, marker)``: random values in [0, 1], and a marker
of 1 on exactly two steps. The target is the sum of the two marked values, so the model
has to find the marked steps wherever they are: the attention weights do that, with no
recurrence. The model (:class:`~batchfold.models.attention.AttentionClassifier`, with one
output) is plain per-sequence PyTorch code, and ``batch_map`` runs a batch of sequences of
different lengths; at the end the same weights run as blocks
(:func:`~batchfold.models.attention.attention_classifier_blocks`) and give the same
predictions. Predicting the mean scores a mean squared error of 1/6; Raffel and Ellis
count a model as solving the task below 0.01. Run with ``python examples/attention.py``.
"""

from __future__ import annotations

import random
import time

import torch
import torch.nn.functional as F

import batchfold as bf
from batchfold.blocks import compile
from batchfold.models.attention import AttentionClassifier, attention_classifier_blocks


def addition_problem(rng: random.Random) -> tuple[torch.Tensor, float]:
    """One sequence ``[T, 2]`` of ``(value, marker)`` steps and the sum of its marked values."""
    length = rng.randint(5, 12)
    values = [rng.random() for _ in range(length)]
    marked = rng.sample(range(length), 2)
    steps = [[v, 1.0 if t in marked else 0.0] for t, v in enumerate(values)]
    return torch.tensor(steps), sum(values[t] for t in marked)


def predict(model: AttentionClassifier, sequences: list[torch.Tensor]) -> torch.Tensor:
    """The model's prediction for each sequence, ``[n]``, run as one ``batch_map``."""
    # The code reads one sequence; torch.as_tensor makes it a per-instance value, so its
    # ops are recorded for every sequence and run batched (sequences of one length together).
    return torch.stack(bf.batch_map(lambda x: model(torch.as_tensor(x))[0], sequences))


def mse(model: AttentionClassifier, data: list[tuple[torch.Tensor, float]]) -> float:
    """The mean squared error on ``data``."""
    with torch.no_grad():
        predictions = predict(model, [x for x, _ in data])
    return F.mse_loss(predictions, torch.tensor([y for _, y in data])).item()


def main() -> None:
    """Train for a few epochs, report the test error, and check the blocks on the same weights."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rng = random.Random(0)
    train = [addition_problem(rng) for _ in range(2000)]
    test = [addition_problem(rng) for _ in range(300)]
    model = AttentionClassifier(in_dim=2, dim=32, hidden=32, n_outputs=1)
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    start = time.perf_counter()
    for epoch in range(5):
        rng.shuffle(train)
        for i in range(0, len(train), 50):
            batch = train[i : i + 50]
            predictions = predict(model, [x for x, _ in batch])
            loss = F.mse_loss(predictions, torch.tensor([y for _, y in batch]))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch + 1}: test mean squared error {mse(model, test):.5f}")
    print(f"trained in {time.perf_counter() - start:.1f} s (predicting the mean: 0.1667)")
    print(f"the last batch_map (test set, 8 lengths): {bf.last_stats()}")

    x, y = test[0]
    alpha = model.attention.weights(model.encode(x)).detach()
    print(f"markers {x[:, 1].tolist()}\nweights {[round(a, 2) for a in alpha.tolist()]}")
    print(f"target {y:.3f}, prediction {model(x).item():.3f}")

    blocks = compile(attention_classifier_blocks(model))
    with torch.no_grad():
        from_blocks, _ = blocks([x.tolist() for x, _ in test])
        eager = torch.stack([model(x) for x, _ in test])
    print(f"blocks on the same weights: largest difference {(from_blocks - eager).abs().max():.1e}")


if __name__ == "__main__":
    main()
