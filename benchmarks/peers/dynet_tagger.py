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

    python dynet_tagger.py SENTENCES.json [--autobatch 0,1,2] [--mem 4096]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from dynet_modes import SentenceTrainer, sentence_main  # noqa: E402

WORD, CHAR, HIDDEN = 100, 50, 125


class Tagger(SentenceTrainer):
    def __init__(self, dy, data: dict) -> None:
        words, chars, tags = data["words"], data["chars"], data["tags"]
        pc = dy.ParameterCollection()
        super().__init__(dy, pc)
        self.words = pc.add_lookup_parameters((words, WORD))
        self.chars = pc.add_lookup_parameters((chars, CHAR))
        self.char_forward = dy.VanillaLSTMBuilder(1, CHAR, CHAR, pc)
        self.char_backward = dy.VanillaLSTMBuilder(1, CHAR, CHAR, pc)
        self.forward = dy.VanillaLSTMBuilder(1, WORD + 2 * CHAR, HIDDEN, pc)
        self.backward = dy.VanillaLSTMBuilder(1, WORD + 2 * CHAR, HIDDEN, pc)
        self.out_w = pc.add_parameters((tags, 2 * HIDDEN))
        self.out_b = pc.add_parameters(tags)

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


if __name__ == "__main__":
    sys.exit(sentence_main(__file__, __doc__, Tagger))
