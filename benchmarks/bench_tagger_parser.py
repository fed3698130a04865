"""DyNet's BiLSTM tagger and arc-hybrid parser on UD English-EWT: batched vs one sentence at a time.

The same single-sentence code (:mod:`batchfold.models.tagger`, :mod:`batchfold.models.parser`)
runs two ways on the same model weights and the same sentences, in one process:

* **one at a time**: plain eager PyTorch, sentence after sentence; for training, the
  sentences' losses are summed and one backward pass and one SGD step follow, as DyNet
  without autobatching does with a minibatch.
* **batch_map**: the batch's sentences recorded together and run batched, with the agenda
  scheduler (the default) and, beside it, the depth one; greedy parsing batches across its
  per-transition reads (sync points).
* **DyNet** (training, where ``benchmarks/setup_peers.sh`` installed it): the same tagger
  and parser at the same sizes on the same sentences and gold transitions, with autobatching
  off, agenda and depth (``peers/dynet_tagger.py``, ``peers/dynet_parser.py``; DyNet's own
  random weights). Greedy parsing is not run on DyNet: its autobatching cannot batch across
  the read of each transition's scores.

Measured: tagger training sentences/s (forward, backward, SGD step), parser training
sentences/s (static oracle, projective sentences), and greedy parsing sentences/s (no
gradients, dev sentences). Sizes as in Kiperwasser and Goldberg (2016) and the DyNet
autobatching paper: word vectors 100, character vectors and character LSTM 50 (tagger),
UPOS vectors 25 (parser), BiLSTM 125 per direction (1 layer for the tagger, 2 for the
parser), MLP hidden 100. The models are untrained: speed does not depend on the weights.

    python benchmarks/bench_tagger_parser.py            # batches of 16, 64 and 256
    python benchmarks/bench_tagger_parser.py --quick    # batches of 8, one repeat

Writes ``benchmarks/results/tagger-parser[-quick].json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

import batchfold as bf
from baselines import Timing, time_inference, time_training
from batchfold.data.conllu import Sentence
from batchfold.data.ud import build_vocabs, load_ud
from batchfold.models.parser import ArcHybridParser, feature_positions, parse, sentence_loss
from batchfold.models.tagger import BiLSTMTagger, sentence_losses
from batchfold.models.transitions import ArcHybrid, oracle_transitions
from batchfold.schedule import Scheduler
from machine import describe_machine, markdown_table
from peer_runner import PeerUnavailable, run_peer

RESULTS = Path(__file__).resolve().parent / "results"
MODES = ("one at a time", "batch_map", "batch_map depth")  # batch_map: the agenda scheduler
DYNET_MODES = ("none", "agenda", "depth")


class SentenceRunner:
    """A batch's summed loss (or its parses) computed one way; keeps batch_map's last stats."""

    def __init__(
        self, per_sentence: Callable[[Sentence], Any], combine: Callable[[list[Any]], Any]
    ) -> None:
        self.per_sentence, self.combine = per_sentence, combine
        self.stats: bf.Stats | None = None
        self.batched = False
        self.scheduler: Scheduler = "agenda"

    def __call__(self, batch: Sequence[Sentence]) -> Any:
        if self.batched:
            results, self.stats = bf.batch_map(
                self.per_sentence, batch, scheduler=self.scheduler, return_stats=True
            )
        else:
            results = [self.per_sentence(s) for s in batch]
        return self.combine(results)


def _sum_tagger(results: list[list[Tensor]]) -> Tensor:
    return torch.stack([loss for sentence in results for loss in sentence]).sum()


def _sum_parser(results: list[Tensor]) -> Tensor:
    return torch.stack(results).sum()


def _batches(sentences: list[Sentence], size: int, count: int) -> list[list[Sentence]]:
    if len(sentences) < size * count:
        raise ValueError(f"need {size * count} sentences for {count} batches of {size}")
    return [sentences[i * size : (i + 1) * size] for i in range(count)]


def measure(
    runner: SentenceRunner,
    params: list[Tensor],
    batches: list[list[Sentence]],
    training: bool,
    warmup: int,
    repeats: int,
) -> Timing:
    """Time training steps (forward, backward, SGD step) or gradient-free calls."""
    # the timing helpers are annotated for trees but take any batches and runner
    call: Any = runner
    items: Any = batches
    if training:
        sgd = torch.optim.SGD(params, lr=1e-4)
        return time_training(call, items, sgd, warmup=warmup, repeats=repeats)
    return time_inference(call, items, warmup=warmup, repeats=repeats)


def row(task: str, size: int, mode: str, timing: Timing, runner: SentenceRunner) -> dict[str, Any]:
    """One result row; batch_map rows carry their time split and batching statistics."""
    out: dict[str, Any] = {
        "task": task,
        "batch_size": size,
        "mode": mode,
        "sentences_per_s": timing.trees_per_s,
        "median_s": timing.median_s,
        "times_s": timing.times,
    }
    if mode != "one at a time" and runner.stats is not None:
        stats = runner.stats
        out.update(
            record_s=stats.record_s,
            schedule_s=stats.schedule_s,
            execute_s=stats.execute_s,
            nodes=stats.nodes,
            steps=stats.steps,
            syncs=stats.syncs,
            mean_batch=stats.mean_batch,
            fallbacks=stats.fallbacks,
        )
    return out


def dynet_rows(
    task: str,
    script: str,
    sizes: dict[str, int],
    batches: list[list[dict[str, Any]]],
    repeats: int,
    notes: list[str],
) -> list[dict[str, Any]]:
    """One task on DyNet (each autobatch mode) over encoded batches the others timed."""
    # the order time_training uses: one warm-up batch, then the batches in turn
    order = [batches[i % len(batches)] for i in range(1 + repeats)]
    size = len(batches[0])
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "sentences.json"
        path.write_text(json.dumps({**sizes, "batches": order}))
        try:
            lines = run_peer("dynet", script, [str(path)])
        except PeerUnavailable as error:
            notes.append(f"dynet {task}, batch {size}: {error}")
            return []
    return [
        {
            "task": task,
            "batch_size": size,
            "mode": f"dynet {line['mode']}",
            "sentences_per_s": size / line["median_s"],
            "median_s": line["median_s"],
            "times_s": line["times_s"],
        }
        for line in lines
    ]


def tagger_input(tagger: BiLSTMTagger, s: Sentence) -> dict[str, Any]:
    """What ``peers/dynet_tagger.py`` reads of a sentence: word, character and tag ids."""
    return {
        "words": [tagger.word_id(w) for w in s.words],
        "chars": [tagger.char_ids(w) for w in s.words],
        "tags": tagger.vocabs.upos.encode(s.upos),
    }


def parser_input(parser: ArcHybridParser, s: Sentence) -> dict[str, Any]:
    """What ``peers/dynet_parser.py`` reads: token ids, and each gold transition's features.

    A feature is a token position from :func:`feature_positions`, -1 for the pad vector.
    """
    config = ArcHybrid(len(s))
    features, targets = [], []
    for action, label in oracle_transitions(s):
        features.append([-1 if p is None else p for p in feature_positions(config)])
        targets.append([int(action), -1 if label is None else parser.vocabs.deprels.index(label)])
        config.apply(action, label)
    words, tags = zip(*parser.token_ids(s), strict=True)
    return {"words": words, "tags": tags, "features": features, "targets": targets}


def parse_agreement(model: ArcHybridParser, batch: list[Sentence]) -> float:
    """The share of sentences whose batched parse equals the one-at-a-time parse."""
    with torch.no_grad():
        batched = bf.batch_map(partial(parse, model), batch)
        eager = [parse(model, s) for s in batch]
    return sum(a == b for a, b in zip(batched, eager, strict=True)) / len(batch)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Build both models, time every configuration; returns the JSON-ready results."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    train, dev = load_ud("train", path=args.data), load_ud("dev", path=args.data)
    vocabs = build_vocabs(train)
    random.Random(0).shuffle(train)
    random.Random(1).shuffle(dev)
    projective = [s for s in train if s.is_projective]
    tagger = BiLSTMTagger(vocabs, word_dim=100, char_dim=50, hidden=125, layers=1).to(device)
    parser = ArcHybridParser(
        vocabs, word_dim=100, pos_dim=25, hidden=125, layers=2, mlp_hidden=100
    ).to(device)
    parser.eval()  # decoding; training below only differs by word dropout, which is off
    workloads = [
        ("tagger training", tagger, train, True, partial(sentence_losses, tagger), _sum_tagger),
        ("parser training", parser, projective, True, partial(sentence_loss, parser), _sum_parser),
        ("greedy parsing", parser, dev, False, partial(parse, parser), list),
    ]
    peers: dict[str, tuple[str, dict[str, int], Callable[[Sentence], dict[str, Any]]]] = {
        "tagger training": (
            "dynet_tagger.py",
            {"words": len(vocabs.words), "chars": len(vocabs.chars), "tags": len(vocabs.upos)},
            partial(tagger_input, tagger),
        ),
        "parser training": (
            "dynet_parser.py",
            {
                "words": parser.word_embedding.num_embeddings,
                "tags": len(vocabs.upos) + 2,  # the parser's UPOS rows
                "labels": len(vocabs.deprels),
            },
            partial(parser_input, parser),
        ),
    }
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    agreement: dict[str, float] = {}
    for size in args.batch_sizes:
        for task, model, sentences, training, per_sentence, combine in workloads:
            batches = _batches(sentences, size, args.batches)
            runner = SentenceRunner(per_sentence, combine)
            for mode in MODES:
                runner.batched = mode != "one at a time"
                runner.scheduler = "depth" if mode == "batch_map depth" else "agenda"
                timing = measure(
                    runner, list(model.parameters()), batches, training, args.warmup, args.repeats
                )
                rows.append(row(task, size, mode, timing, runner))
                print(format_row(rows[-1]), flush=True)
            peer = peers.get(task)
            if peer is not None:
                script, sizes, encode = peer
                encoded = [[encode(s) for s in batch] for batch in batches]
                for peer_row in dynet_rows(task, script, sizes, encoded, args.repeats, notes):
                    rows.append(peer_row)
                    print(format_row(rows[-1]), flush=True)
        agreement[str(size)] = parse_agreement(parser, _batches(dev, size, 1)[0])
    return {
        "benchmark": "tagger-parser",
        "machine": describe_machine(args.threads),
        "device": str(device),
        "sizes": {
            "tagger": "word 100, char 50 (char BiLSTM 50 per direction), BiLSTM 125 x 1 layer",
            "parser": "word 100, UPOS 25, BiLSTM 125 x 2 layers, MLP 100",
        },
        "sentences": {"train": len(train), "projective_train": len(projective), "dev": len(dev)},
        "parse_agreement": agreement,
        "rows": rows,
        "notes": notes,
    }


def format_row(r: dict[str, Any]) -> str:
    """A progress line."""
    extra = ""
    if "record_s" in r:
        extra = (
            f"  record {r['record_s']:.3f}s schedule {r['schedule_s']:.3f}s "
            f"execute(forward) {r['execute_s']:.3f}s, {r['syncs']} syncs"
        )
    return (
        f"{r['task']:>16s} b={r['batch_size']:<4d} {r['mode']:<14s} "
        f"{r['sentences_per_s']:9.1f} sentences/s{extra}"
    )


def summary(results: dict[str, Any]) -> str:
    """The markdown report: sentences/s both ways and the speedup of batch_map."""
    rows = results["rows"]
    by_key = {(r["task"], r["batch_size"], r["mode"]): r for r in rows}
    table = []
    for r in rows:
        if r["mode"] != "batch_map":
            continue
        one = by_key[(r["task"], r["batch_size"], "one at a time")]
        total = r["median_s"]
        split = (
            f"{100 * r['record_s'] / total:.0f} / {100 * r['schedule_s'] / total:.0f} / "
            f"{100 * r['execute_s'] / total:.0f}"
            if "record_s" in r
            else ""
        )
        dynet = [by_key.get((r["task"], r["batch_size"], f"dynet {m}")) for m in DYNET_MODES]
        depth = by_key.get((r["task"], r["batch_size"], "batch_map depth"))
        table.append(
            [
                r["task"],
                r["batch_size"],
                f"{one['sentences_per_s']:.1f}",
                f"{r['sentences_per_s']:.1f}",
                f"{r['sentences_per_s'] / one['sentences_per_s']:.1f}x",
                f"{depth['sentences_per_s']:.1f} ({depth['steps']} / {r['steps']})"
                if depth
                else "",
                " / ".join(f"{d['sentences_per_s']:.1f}" for d in dynet if d) if any(dynet) else "",
                r.get("syncs", ""),
                split,
            ]
        )
    head = [
        "task",
        "batch",
        "one at a time, sentences/s",
        "batch_map (agenda), sentences/s",
        "speedup",
        "batch_map depth, sentences/s (steps, depth / agenda)",
        "DyNet none / agenda / depth, sentences/s",
        "syncs",
        "record / schedule / execute-forward, % of step",
    ]
    m = results["machine"]
    agree = ", ".join(f"batch {k}: {v:.0%}" for k, v in results["parse_agreement"].items())
    return (
        f"# BiLSTM tagger and arc-hybrid parser benchmark (UD English-EWT)\n\n"
        f"{m['cpu']}, {m['cpus']} CPUs, {m['threads']} threads, device {results['device']}, "
        f"torch {m['torch']}, commit {m['commit']}, {m['date']}\n\n"
        f"Tagger: {results['sizes']['tagger']}. Parser: {results['sizes']['parser']}.\n"
        f"Batched greedy parses equal to the one-at-a-time ones: {agree}.\n\n"
        + markdown_table(head, table)
        + "\n"
        + "".join(f"\n- {note}" for note in results.get("notes", []))
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Run, print, and write JSON and markdown under benchmarks/results/."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="batches of 8, one timed repeat")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cuda")
    parser.add_argument("--data", default=None, help="folder with the EWT CoNLL-U files")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=None)
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for JSON and markdown")
    args = parser.parse_args(argv)
    args.batch_sizes = args.batch_sizes or ([8] if args.quick else [16, 64, 256])
    args.batches = 1 if args.quick else 2
    args.warmup = 1
    args.repeats = 1 if args.quick else 3
    results = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "tagger-parser-quick" if args.quick else "tagger-parser"
    (args.out / f"{stem}.json").write_text(json.dumps(results, indent=1))
    (args.out / f"{stem}.md").write_text(summary(results))
    print(summary(results))


if __name__ == "__main__":
    main()
