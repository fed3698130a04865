"""Small CoNLL-U texts for the tests of the CoNLL-U reader and of the UD loader."""

from __future__ import annotations


def row(*cols: object) -> str:
    return "\t".join(str(c) for c in cols) + "\n"


def word(i: int | str, form: str, upos: str, head: int | str, deprel: str) -> str:
    return row(i, form, form.lower(), upos, "_", "_", head, deprel, "_", "_")


# "I don't know." with a multiword token (2-3) and an empty node (4.1).
SMALL = (
    "# newdoc id = doc1\n"
    "# sent_id = s1\n"
    "# text = I don't know.\n"
    + word(1, "I", "PRON", 4, "nsubj")
    + row("2-3", "don't", "_", "_", "_", "_", "_", "_", "_", "_")
    + word(2, "do", "AUX", 4, "aux")
    + word(3, "n't", "PART", 4, "advmod")
    + word(4, "know", "VERB", 0, "root")
    + row("4.1", "know", "know", "VERB", "_", "_", "_", "_", "4:conj", "_")
    + word(5, ".", "PUNCT", 4, "punct")
    + "\n"
    "# sent_id = s2\n"
    + word(1, "My", "PRON", 2, "nmod:poss")
    + word(2, "dog", "NOUN", 0, "root")
    + "\n"
)
