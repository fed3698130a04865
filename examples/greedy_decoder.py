"""Greedy decoding with a GRU that branches on its own predictions, batched by batch_map.

``decode`` is code for one sequence: it reads each predicted token (``int(...)``, a sync point
where all sequences pause and what they recorded runs as one batched plan), feeds it back, and
stops at EOS. Run: ``python examples/greedy_decoder.py``.
"""

import torch
import torch.nn.functional as F
from torch import nn

import batchfold as bf

VOCAB, HIDDEN, EOS, MAX_LEN = 12, 32, 0, 25
torch.manual_seed(0)
embed, cell = nn.Embedding(VOCAB, HIDDEN), nn.GRUCell(HIDDEN, HIDDEN)
extra, out = nn.Linear(HIDDEN, HIDDEN), nn.Linear(HIDDEN, VOCAB)
PARAMS = [p for m in (embed, cell, extra, out) for p in m.parameters()]


def step(h: torch.Tensor, token: int) -> torch.Tensor:
    """One GRU step on ``token``; an odd token takes an extra layer (a branch on the token)."""
    h = cell(embed(torch.tensor(token)), h)
    return torch.tanh(extra(h)) if token % 2 == 1 else h


def counting_loss(start: int) -> torch.Tensor:
    """Teacher-forced loss of the task: count down from ``start`` to 1, then EOS (0)."""
    h, loss = torch.zeros(HIDDEN), torch.zeros(())
    for token in range(start, 0, -1):
        h = step(h, token)
        loss = loss + F.cross_entropy(out(h), torch.tensor(token - 1))
    return loss


def decode(start: int) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens after ``start`` up to EOS, and the sum of their log-probabilities."""
    h, token, tokens, score = torch.zeros(HIDDEN), start, [], torch.zeros(())
    while len(tokens) < MAX_LEN:
        log_probs = F.log_softmax(out(h := step(h, token)), dim=-1)
        token = int(log_probs.argmax())  # a sync point: every sequence waits here together
        score = score + log_probs[token]
        tokens.append(token)
        if token == EOS:
            break
    return tokens, score


def main(count: int = 64, train_steps: int = 100) -> None:
    """Train the decoder to count down, then decode ``count`` sequences batched and one by one."""
    optimizer = torch.optim.Adam(PARAMS, lr=0.01)
    for _ in range(train_steps):  # teacher forcing, batched the same way
        loss = torch.stack(bf.batch_map(counting_loss, range(1, VOCAB))).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    starts = [1 + i % (VOCAB - 1) for i in range(count)]
    batched, stats = bf.batch_map(decode, starts, return_stats=True)
    eager = [decode(s) for s in starts]  # one sequence at a time
    assert [t for t, _ in batched] == [t for t, _ in eager], "batched tokens differ"
    scores, want = torch.stack([s for _, s in batched]), torch.stack([s for _, s in eager])
    torch.testing.assert_close(scores, want)
    grads = torch.autograd.grad(scores.sum(), PARAMS)
    for got, expected in zip(grads, torch.autograd.grad(want.sum(), PARAMS), strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-3)  # float32 sums
    lengths = sorted({len(t) for t, _ in batched})
    print(f"trained to count down: loss {loss.item():.4f}; e.g. 7 -> {decode(7)[0]}")
    print(
        f"{count} sequences of {lengths[0]} to {lengths[-1]} tokens, decoded in {stats.syncs} syncs"
    )
    print("batched decoding = one at a time: same tokens, scores and gradients")
    print(stats)  # a segment per decoding step, the steps of all sequences batched in each


if __name__ == "__main__":
    main()
