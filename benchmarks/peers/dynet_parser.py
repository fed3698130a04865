"""The arc-hybrid parser's static-oracle training on DyNet, timed with each autobatch mode.

Runs inside DyNet's virtual environment (``benchmarks/.peers/dynet``). The model is
``batchfold.models.parser.ArcHybridParser`` at the benchmark's sizes: a token is its word
vector (100) and UPOS vector (25); a 2-layer BiLSTM (125 per direction) gives every token a
vector; a configuration's features are the vectors of the top three stack items (a learned
pad vector where the stack is shorter) and of the first buffer item; an MLP (hidden 100,
tanh) scores the 3 transitions and, per arc direction, the relations. A transition's loss is
the cross-entropy of the gold transition plus, for an arc, of its relation among that
direction's relations. Its weights are DyNet's own random ones.

The oracle runs in ``bench_tagger_parser.py``, which writes each sentence's token ids and
its gold transitions with their feature positions (JSON)::

    {"words": N, "tags": N, "labels": N, "batches": [[{"words": [...], "tags": [...],
     "features": [[s3, s2, s1, b0], ...], "targets": [[action, label], ...]}, ...], ...]}

(a feature position -1 is the pad vector; a label -1 is none). The first batch is the
warm-up, the others are timed. It prints one JSON line per mode, as ``dynet_tagger.py``.

Usage::

    python dynet_parser.py SENTENCES.json [--autobatch 0,1,2] [--mem 4096]
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from dynet_modes import SentenceTrainer, sentence_main  # noqa: E402

WORD, POS, HIDDEN, LAYERS, MLP, TRANSITIONS = 100, 25, 125, 2, 100, 3


class Parser(SentenceTrainer):
    def __init__(self, dy, data: dict) -> None:
        words, tags, labels = data["words"], data["tags"], data["labels"]
        pc = dy.ParameterCollection()
        super().__init__(dy, pc)
        self.labels = labels
        self.words = pc.add_lookup_parameters((words, WORD))
        self.tags = pc.add_lookup_parameters((tags, POS))
        self.bilstm = dy.BiRNNBuilder(LAYERS, WORD + POS, 2 * HIDDEN, pc, dy.VanillaLSTMBuilder)
        self.pad = pc.add_parameters(2 * HIDDEN)
        self.hidden_w = pc.add_parameters((MLP, 4 * 2 * HIDDEN))
        self.hidden_b = pc.add_parameters(MLP)
        self.out_w = pc.add_parameters((TRANSITIONS + 2 * labels, MLP))
        self.out_b = pc.add_parameters(TRANSITIONS + 2 * labels)

    def sentence_losses(self, sentence: dict, out: list) -> None:
        dy = self.dy
        inputs = [
            dy.concatenate([self.words[w], self.tags[t]])
            for w, t in zip(sentence["words"], sentence["tags"], strict=True)
        ]
        vectors = self.bilstm.transduce(inputs)
        pad = dy.parameter(self.pad)
        for positions, (action, label) in zip(
            sentence["features"], sentence["targets"], strict=True
        ):
            features = dy.concatenate([vectors[p] if p >= 0 else pad for p in positions])
            hidden = dy.tanh(dy.affine_transform([self.hidden_b, self.hidden_w, features]))
            scores = dy.affine_transform([self.out_b, self.out_w, hidden])
            loss = dy.pickneglogsoftmax(dy.pick_range(scores, 0, TRANSITIONS), action)
            if label >= 0:  # the relation, among the relations of the arc's direction
                start = TRANSITIONS + (action - 1) * self.labels
                by_label = dy.pick_range(scores, start, start + self.labels)
                loss = loss + dy.pickneglogsoftmax(by_label, label)
            out.append(loss)


if __name__ == "__main__":
    sys.exit(sentence_main(__file__, __doc__, Parser))
