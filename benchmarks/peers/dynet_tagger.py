"""The BiLSTM tagger with character features on DyNet, timed with each autobatch mode.

Runs inside DyNet's virtual environment (``benchmarks/.peers/dynet``). The model is
``batchfold.models.tagger.BiLSTMTagger`` at the benchmark's sizes: a word is its word
vector (100) followed by the last states of a character BiLSTM (50 per direction) over its
letters; a BiLSTM (125 per direction, one layer) runs over the sentence, and a linear layer
gives each word's tag scores; the loss is the summed cross-entropy of every word of the batch.
Its weights are DyNet's own random ones (the speed does not depend on them).

The sentence file (JSON, written by ``bench_tagger_parser.py``) holds
``{"words": N, "chars": N, "tags": N, "batches": [[{"words": [...], "chars": [[...]...],
"tags": [...]}, ...], ...]}``: the first batch is the warm-up, the others are timed. A training
step builds the graph of every sentence of the batch, sums the losses, runs forward,
backward and one SGD update. For each mode it prints one JSON line::

    {"system": "dynet", "mode": "agenda", "autobatch": 1, "batch_size": 16,
     "times_s": [...], "median_s": ...}

Usage::

    python dynet_tagger.py SENTENCES.json [--autobatch 0,1,2] [--mem 2048]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from dynet_modes import MODE_NAMES, run_each_mode, start_dynet  # noqa: E402

WORD, CHAR, HIDDEN = 100, 50, 125


class Tagger:
    def __init__(self, dy, words: int, chars: int, tags: int) -> None:
        self.dy = dy
        pc = self.pc = dy.ParameterCollection()
        self.words = pc.add_lookup_parameters((words, WORD))
        self.chars = pc.add_lookup_parameters((chars, CHAR))
        self.char_forward = dy.VanillaLSTMBuilder(1, CHAR, CHAR, pc)
        self.char_backward = dy.VanillaLSTMBuilder(1, CHAR, CHAR, pc)
        self.forward = dy.VanillaLSTMBuilder(1, WORD + 2 * CHAR, HIDDEN, pc)
        self.backward = dy.VanillaLSTMBuilder(1, WORD + 2 * CHAR, HIDDEN, pc)
        self.out_w = pc.add_parameters((tags, 2 * HIDDEN))
        self.out_b = pc.add_parameters(tags)
        self.trainer = dy.SimpleSGDTrainer(pc, learning_rate=1e-4)
        self.trainer.set_clip_threshold(0.0)  # plain SGD, as the PyTorch systems use

    def word(self, word: int, chars: list[int]):
        dy = self.dy
        letters = [self.chars[c] for c in chars]
        last_forward = self.char_forward.initial_state().transduce(letters)[-1]
        last_backward = self.char_backward.initial_state().transduce(letters[::-1])[-1]
        return dy.concatenate([self.words[word], last_forward, last_backward])

    def sentence_losses(self, sentence: dict, out: list) -> None:
        dy = self.dy
        xs = [self.word(w, c) for w, c in zip(sentence["words"], sentence["chars"], strict=True)]
        forward = self.forward.initial_state().transduce(xs)
        backward = self.backward.initial_state().transduce(xs[::-1])[::-1]
        for f, b, tag in zip(forward, backward, sentence["tags"], strict=True):
            scores = dy.affine_transform([self.out_b, self.out_w, dy.concatenate([f, b])])
            out.append(dy.pickneglogsoftmax(scores, tag))

    def train_step(self, batch: list[dict]) -> float:
        self.dy.renew_cg()
        losses: list = []
        for sentence in batch:
            self.sentence_losses(sentence, losses)
        loss = self.dy.esum(losses)
        value = loss.value()
        loss.backward()
        self.trainer.update()
        return value


def run_mode(args: argparse.Namespace, mode: int) -> None:
    dy, version = start_dynet(args.mem, mode)
    with open(args.sentences) as f:
        data = json.load(f)
    model = Tagger(dy, data["words"], data["chars"], data["tags"])
    warmup, *timed = data["batches"]
    model.train_step(warmup)
    times = []
    for batch in timed:
        start = time.perf_counter()
        model.train_step(batch)
        times.append(time.perf_counter() - start)
    line = {
        "system": "dynet",
        "version": version,
        "mode": MODE_NAMES[mode],
        "autobatch": mode,
        "batch_size": len(warmup),
        "times_s": times,
        "median_s": statistics.median(times),
    }
    print(json.dumps(line), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sentences", help="sentence file (JSON, see above)")
    parser.add_argument("--autobatch", default="0,1,2", help="modes: 0 none, 1 agenda, 2 depth")
    parser.add_argument("--mem", default="2048", help="DyNet memory pool in MB (--dynet-mem)")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)  # a child gets argv plus its own --autobatch, which wins
    return run_each_mode(__file__, argv, args.autobatch, lambda m: run_mode(args, m))


if __name__ == "__main__":
    sys.exit(main())
