"""Tiny UD treebanks on disk for the tagger and parser task tests."""

from __future__ import annotations

from pathlib import Path

from batchfold.data.conllu import Sentence


def conllu_text(sentences: list[Sentence]) -> str:
    """The sentences written as CoNLL-U (lemma: the lower-cased word; no features)."""
    blocks = []
    for s in sentences:
        lines = [f"# sent_id = {s.sent_id}"]
        columns = zip(s.words, s.upos, s.heads, s.deprels, strict=True)
        for i, (w, t, h, d) in enumerate(columns, start=1):
            lines.append("\t".join([str(i), w, w.lower(), t, "_", "_", str(h), d, "_", "_"]))
        blocks.append("\n".join(lines) + "\n")
    return "\n".join(blocks) + "\n"


def write_treebank(
    folder: Path, train: list[Sentence], dev: list[Sentence], test: list[Sentence]
) -> None:
    """Write ``en_ewt-ud-{train,dev,test}.conllu`` into ``folder``, as ``load_ud`` finds them."""
    for split, sentences in (("train", train), ("dev", dev), ("test", test)):
        (folder / f"en_ewt-ud-{split}.conllu").write_text(conllu_text(sentences))
