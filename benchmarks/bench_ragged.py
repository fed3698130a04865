"""Ragged batching: per-instance code on whole variable-length tensors, against a plain loop.

Each workload is written the way a user writes one instance, on whole tensors of the
instance's own size, and run on the same weights and inputs as a plain Python loop (eager
PyTorch) and through ``batch_map``: with ragged batching (the default; each scheduler) and
without (``ragged=False``: only values of equal shapes batch). Losses are checked against the
loop's before timing. The systems take turns round by round (see
``bench_lazy.time_interleaved``), so that a shared machine's slow spells weigh on all of them
alike.

- **message passing** over ESOL molecules: per molecule ``h`` ``[atoms, d]`` and its adjacency
  ``A`` ``[atoms, atoms]``; 3 rounds of ``h = relu(self(h) + A @ msg(h))``, a sum readout, a
  squared error (rdkit featurisation; random graphs of ESOL's sizes without the data); once
  written in one method, once with the model called as a module ``model(x, A)``;
- **feed-forward attention** (Raffel and Ellis) over whole ``[T, 16]`` sequences, T 5-100,
  a 5-class loss per sequence;
- **BiLSTM tagger on whole sentences**: one ``nn.LSTM`` call per sentence (5-40 words), a
  loss on every word;
- **GRU encoder-decoder with dot-product attention, greedy decoding** to EOS or 30 steps
  (``int(logits.argmax())`` is a sync point): inference, and training on its own greedy
  predictions.

    python benchmarks/bench_ragged.py            # batch 64, 2 threads
    python benchmarks/bench_ragged.py --quick    # fewer batches and repeats
    python benchmarks/bench_ragged.py --device cuda --quick   # on a GPU: ragged-quick-cuda

Writes ``benchmarks/results/ragged[-quick].json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import batchfold as bf
from batchfold.models.attention import AttentionClassifier
from bench_lazy import check, time_interleaved, turns
from machine import describe_machine, markdown_table, write_results

RESULTS = Path(__file__).resolve().parent / "results"
Loss = Callable[[Sequence[Any]], tuple[torch.Tensor, "bf.Stats | None"]]
EOS, MAX_STEPS = 0, 30


def systems(per_instance: Callable[[Any], Any]) -> dict[str, Loss]:
    """The loop and batch_map (ragged with each scheduler, and ragged off) on one function."""

    def loop(batch: Sequence[Any]) -> tuple[torch.Tensor, None]:
        return torch.stack([per_instance(x) for x in batch]).sum(), None

    def batched(scheduler: str, ragged: bool, batch: Sequence[Any]) -> tuple[torch.Tensor, Any]:
        outs, stats = bf.batch_map(
            per_instance,
            batch,
            scheduler=scheduler,  # type: ignore[arg-type]
            ragged=ragged,
            return_stats=True,
        )
        return torch.stack(outs).sum(), stats

    return {
        "plain loop (eager)": loop,
        "batch_map agenda": partial(batched, "agenda", True),
        "batch_map depth": partial(batched, "depth", True),
        "batch_map agenda, ragged off": partial(batched, "agenda", False),
    }


# message passing over molecules -------------------------------------------------------------


class MessagePassing(nn.Module):
    """Three rounds of ``h = relu(self(h) + A @ msg(h))`` on one molecule, a sum readout."""

    def __init__(self, features: int, dim: int = 64, rounds: int = 3) -> None:
        super().__init__()
        self.embed = nn.Linear(features, dim)
        self.update = nn.ModuleList(nn.Linear(dim, dim) for _ in range(rounds))
        self.message = nn.ModuleList(nn.Linear(dim, dim) for _ in range(rounds))
        self.readout = nn.Linear(dim, 1)

    def loss(self, molecule: tuple[torch.Tensor, torch.Tensor, float]) -> torch.Tensor:
        """The squared error, written in one method (its layers called inside)."""
        x, adjacency, target = molecule
        a = torch.as_tensor(adjacency)
        h = torch.relu(self.embed(torch.as_tensor(x)))
        for update, message in zip(self.update, self.message, strict=True):
            h = torch.relu(update(h) + a @ message(h))
        prediction = self.readout(h.sum(0)).squeeze(0)
        return (prediction - target) ** 2

    def forward(self, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """The prediction for one molecule: the same rounds and readout as :meth:`loss`."""
        h = torch.relu(self.embed(x))
        for update, message in zip(self.update, self.message, strict=True):
            h = torch.relu(update(h) + a @ message(h))
        return self.readout(h.sum(0)).squeeze(0)

    def module_loss(self, molecule: tuple[torch.Tensor, torch.Tensor, float]) -> torch.Tensor:
        """:meth:`loss` with the model called as a module, ``model(x, A)``."""
        x, adjacency, target = molecule
        return (self(torch.as_tensor(x), torch.as_tensor(adjacency)) - target) ** 2


def molecules(count: int, rng: random.Random) -> list[tuple[torch.Tensor, torch.Tensor, float]]:
    """ESOL molecules (atom features, adjacency, target), or random graphs of their sizes."""
    try:
        from batchfold.data.molecules import load_esol

        data = list(load_esol())
    except Exception as error:  # no rdkit or no data: graphs of ESOL's size range
        print(f"ESOL unavailable ({type(error).__name__}: {error}); random graphs instead")
        data = None
    out = []
    for _ in range(count):
        if data:
            m = data[rng.randrange(len(data))]
            n, x, bonds = m.n_atoms, m.atom_features, m.bonds
        else:
            n = rng.randint(2, 40)
            x = torch.randn(n, 32)
            bonds = torch.tensor([[i, rng.randrange(i)] for i in range(1, n)]).view(-1, 2)
            bonds = torch.cat([bonds, bonds.flip(1)])
        adjacency = torch.zeros(n, n)
        adjacency[bonds[:, 0], bonds[:, 1]] = 1.0
        out.append((x, adjacency, rng.gauss(0, 1)))
    return out


# attention and the tagger -------------------------------------------------------------------


class Tagger(nn.Module):
    """A BiLSTM tagger written for one whole sentence: one ``nn.LSTM`` call per sentence."""

    def __init__(self, vocab: int = 1000, dim: int = 64, hidden: int = 64, tags: int = 17):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(dim, hidden, bidirectional=True)
        self.out = nn.Linear(2 * hidden, tags)

    def loss(self, sentence: tuple[list[int], list[int]]) -> torch.Tensor:
        words, tags = sentence
        device = self.out.weight.device
        states, _ = self.lstm(self.embed(torch.tensor(words, device=device)))
        return F.cross_entropy(self.out(states), torch.tensor(tags, device=device), reduction="sum")


# a GRU encoder-decoder decoding greedily ----------------------------------------------------


class Seq2Seq(nn.Module):
    """A GRU encoder, a GRU-cell decoder with dot-product attention, greedy decoding."""

    def __init__(self, vocab: int = 50, dim: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.encoder = nn.GRU(dim, dim)
        self.decoder = nn.GRUCell(dim, dim)
        self.out = nn.Linear(2 * dim, vocab)

    def decode(self, tokens: list[int]) -> tuple[list[int], torch.Tensor]:
        """Greedy tokens, and the summed log-likelihood of the reversed input under them."""
        device = self.out.weight.device
        states, last = self.encoder(self.embed(torch.tensor(tokens, device=device)))
        h, token, out, score = last[0], tokens[-1], [], torch.zeros((), device=device)
        target = tokens[::-1]
        while len(out) < MAX_STEPS:
            h = self.decoder(self.embed(torch.tensor(token, device=device)), h)
            weights = torch.softmax(states @ h, 0)
            logits = self.out(torch.cat([h, weights @ states]))
            if len(out) < len(target):
                score = score + F.log_softmax(logits, 0)[target[len(out)]]
            token = int(logits.argmax())  # a sync point
            out.append(token)
            if token == EOS:
                break
        return out, score


def check_decoding(model: Seq2Seq, batches: list[list[list[int]]]) -> None:
    """batch_map decodes exactly the tokens of one sequence at a time, with both schedulers,
    on a float64 copy of ``model``. In float32 two logits can tie to within rounding, and a
    batched matmul rounds otherwise than one row at a time: such a tie is not a difference
    between the systems, so exactness is checked where ties do not happen by chance."""
    exact = copy.deepcopy(model).double()
    with torch.no_grad():
        for batch in batches:
            want = [exact.decode(x)[0] for x in batch]
            for scheduler in ("agenda", "depth"):
                outs = bf.batch_map(exact.decode, batch, scheduler=scheduler)
                if [o[0] for o in outs] != want:
                    raise RuntimeError(
                        f"batch_map ({scheduler}) decoded other tokens than one at a time "
                        "in float64"
                    )


TIE = 1e-5  # a float32 near tie: logits this close may swap between batched and one-row matmuls
# on a GPU, batched and one-row kernels reduce in other orders, and cuDNN's RNNs use TF32
TIE_GPU = 1e-4


def tie_margin(model: Seq2Seq, tokens: list[int], prefix: list[int], a: int, b: int) -> float:
    """How far apart logits ``a`` and ``b`` are (float32, one sequence) at the step after
    ``prefix``: the step where two systems chose ``a`` and ``b``."""
    with torch.no_grad():
        device = model.out.weight.device
        states, last = model.encoder(model.embed(torch.tensor(tokens, device=device)))
        h = last[0]
        for token in [tokens[-1], *prefix]:
            h = model.decoder(model.embed(torch.tensor(token, device=device)), h)
        logits = model.out(torch.cat([h, torch.softmax(states @ h, 0) @ states]))
    return abs(float(logits[a] - logits[b]))


def device_type(model: nn.Module) -> str:
    """The device type the model's weights are on."""
    return next(model.parameters()).device.type


def time_decoding(model: Seq2Seq, batches: list[list[list[int]]], repeats: int) -> dict[str, Any]:
    """Median seconds to decode a batch greedily (no gradients), one sequence at a time and
    through batch_map, the systems taking turns round by round (see ``time_interleaved``).
    Each row counts the sequences whose float32 tokens differ from one at a time; each such
    difference must start at a near tie of two logits (:data:`TIE`), else it is an error
    (:func:`check_decoding` checks exactness in float64)."""
    with torch.no_grad():
        want = [[model.decode(x)[0] for x in batch] for batch in batches]
    systems = ("one at a time", "batch_map agenda", "batch_map depth")
    times: dict[str, list[float]] = {system: [] for system in systems}
    syncs: dict[str, list[int]] = {system: [] for system in systems}
    differ = dict.fromkeys(systems, 0)
    for i, system in turns(systems, repeats):  # round 0 warms up
        for batch, tokens in zip(batches, want, strict=True):
            start = time.perf_counter()
            with torch.no_grad():
                if system == "one at a time":
                    got = [model.decode(x)[0] for x in batch]
                else:
                    outs, stats = bf.batch_map(
                        model.decode,
                        batch,
                        scheduler=system.split()[-1],  # type: ignore[arg-type]
                        return_stats=True,
                    )
                    got = [o[0] for o in outs]
                    syncs[system].append(stats.syncs)
            if i:
                times[system].append(time.perf_counter() - start)
                continue
            for x, g, w in zip(batch, got, tokens, strict=True):
                if g == w:
                    continue
                k = next(k for k, (p, q) in enumerate(zip(g, w, strict=False)) if p != q)
                margin = tie_margin(model, x, w[:k], w[k], g[k])
                if margin > (TIE if device_type(model) == "cpu" else TIE_GPU):
                    raise RuntimeError(
                        f"{system} decoded other tokens than one at a time for {x}: "
                        f"step {k}, logits {margin:.2e} apart (not a float32 tie)"
                    )
                differ[system] += 1
    return {
        system: {
            "median_s": statistics.median(times[system]),
            "syncs": max(syncs[system], default=0),
            "differing_sequences": differ[system],
        }
        for system in systems
    }


def workloads(
    quick: bool, rng: random.Random, device: torch.device
) -> dict[str, tuple[nn.Module, Callable, Callable]]:
    """name -> (model, per-instance loss, make(size, count) -> batches), on ``device``."""
    torch.manual_seed(0)
    esol = [
        tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in m)
        for m in molecules(2000, rng)
    ]
    mp = MessagePassing(esol[0][0].shape[1]).to(device)
    attention = AttentionClassifier(in_dim=16, dim=64, hidden=64, n_outputs=5).to(device)
    tagger = Tagger().to(device)

    def attention_loss(item: tuple[torch.Tensor, int]) -> torch.Tensor:
        x, y = item
        return F.cross_entropy(attention(torch.as_tensor(x)), torch.tensor(y, device=x.device))

    def sequences(size: int, count: int) -> list[list[Any]]:
        return [
            [
                (torch.randn(rng.randint(5, 100), 16).to(device), rng.randrange(5))
                for _ in range(size)
            ]
            for _ in range(count)
        ]

    def sentences(size: int, count: int) -> list[list[Any]]:
        def one() -> tuple[list[int], list[int]]:
            n = rng.randint(5, 40)
            return [rng.randrange(1000) for _ in range(n)], [rng.randrange(17) for _ in range(n)]

        return [[one() for _ in range(size)] for _ in range(count)]

    return {
        "message passing (ESOL)": (
            mp,
            mp.loss,
            lambda size, count: [rng.sample(esol, size) for _ in range(count)],
        ),
        "message passing (ESOL), model(x, A)": (
            mp,
            mp.module_loss,
            lambda size, count: [rng.sample(esol, size) for _ in range(count)],
        ),
        "feed-forward attention": (attention, attention_loss, sequences),
        "BiLSTM tagger, whole sentences": (tagger, tagger.loss, sentences),
    }


def run(quick: bool, threads: int, size: int, device: str = "cpu") -> dict[str, Any]:
    """Measure every workload and system on ``device``; returns the JSON-ready results."""
    torch.set_num_threads(threads)
    rng = random.Random(0)
    on = torch.device(device)
    rows = []
    count, repeats = (2, 1) if quick else (4, 4)  # rounds after the first are timed
    for name, (model, per_instance, make) in workloads(quick, rng, on).items():
        loss_systems = systems(per_instance)
        check(model, loss_systems, make(8, 1)[0])
        batches = make(size, count)
        for system, row in time_interleaved(model, loss_systems, batches, repeats).items():
            row.update(workload=name, mode="training", batch=size, system=system)
            rows.append(row)
            print(f"{name:32s} {system:30s} {size / row['median_s']:8.1f} instances/s")
    seq2seq = Seq2Seq().to(on)

    def source() -> list[int]:
        return [rng.randrange(1, 50) for _ in range(rng.randint(5, 20))]

    decode_batches = [[source() for _ in range(size)] for _ in range(count)]
    check_decoding(seq2seq, decode_batches)
    for system, row in time_decoding(seq2seq, decode_batches, repeats).items():
        row.update(
            workload="GRU encoder-decoder, greedy",
            mode="inference",
            batch=size,
            sequences=size * count,
        )
        rows.append({**row, "system": system})
        print(f"greedy decoding {system:30s} {size / row['median_s']:8.1f} instances/s")

    def greedy_loss(tokens: list[int]) -> torch.Tensor:
        return -seq2seq.decode(tokens)[1]

    loss_systems = systems(greedy_loss)
    loss_systems.pop("batch_map agenda, ragged off")
    for system, row in time_interleaved(seq2seq, loss_systems, decode_batches, repeats).items():
        row.update(
            workload="GRU encoder-decoder, greedy", mode="training", batch=size, system=system
        )
        rows.append(row)
        print(f"greedy training {system:30s} {size / row['median_s']:8.1f} instances/s")
    for row in rows:
        row["per_s"] = size / row["median_s"]
        base = next(
            r
            for r in rows
            if r["workload"] == row["workload"]
            and r["mode"] == row["mode"]
            and r["system"] in ("plain loop (eager)", "one at a time")
        )
        row["vs_loop"] = row["per_s"] / base["per_s"]
    machine = describe_machine(threads)
    if on.type == "cuda":
        machine["cpu"] = f"{torch.cuda.get_device_name(on)} with {machine['cpu']}"
    return {"machine": machine, "batch": size, "device": device, "rows": rows}


def summary(results: dict[str, Any]) -> str:
    """The results as a markdown table."""
    m = results["machine"]
    head = [
        "workload",
        "mode",
        "system",
        "instances/s",
        "vs loop",
        "steps",
        "syncs",
        "record/sched/exec ms",
    ]
    table = [
        [
            r["workload"],
            r["mode"],
            r["system"],
            f"{r['per_s']:.1f}",
            f"{r['vs_loop']:.2f}x",
            f"{r['steps']:.0f}" if "steps" in r else "",
            r.get("syncs", ""),
            f"{r['record_s'] * 1e3:.0f} / {r['schedule_s'] * 1e3:.0f} / {r['execute_s'] * 1e3:.0f}"
            if "record_s" in r
            else "",
        ]
        for r in results["rows"]
    ]
    differ = [r for r in results["rows"] if r.get("differing_sequences")]
    tie = TIE if results.get("device", "cpu") == "cpu" else TIE_GPU
    notes = "\n" * bool(differ) + "".join(
        f"- {r['system']}, greedy decoding: {r['differing_sequences']} of "
        f"{r['sequences']} sequences decoded in float32 differ from one at a time, each from a "
        f"step where two logits were within {tie:g} of each other; in float64 every sequence "
        "decodes the same.\n"
        for r in differ
    )
    return (
        f"# Ragged batching: per-instance code on whole variable-length tensors\n\n"
        f"{m['cpu']}, {m['cpus']} CPUs, {m['threads']} threads, torch {m['torch']}, commit "
        f"{m['commit']}, {m['date']}. Batch {results['batch']}; training steps (forward, "
        "backward, SGD) or greedy decoding, median over repeats; vs loop: against the same "
        "code run one instance at a time.\n\n" + markdown_table(head, table) + "\n" + notes
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: ``--quick``, ``--threads``, ``--batch-size``, ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer batches and repeats")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--batch-size", type=int, default=64, help="instances per batch")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for JSON and markdown")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default: %(default)s)")
    args = parser.parse_args(argv)
    results = run(args.quick, args.threads, args.batch_size, args.device)
    stem = ("ragged-quick" if args.quick else "ragged") + f"-{args.device}" * (args.device != "cpu")
    write_results(args.out, stem, results, summary(results))


if __name__ == "__main__":
    main()
