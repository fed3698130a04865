from __future__ import annotations

import pytest

from batchfold.data.conllu import Sentence
from batchfold.models.attachment import attachment_scores


def test_attachment_scores() -> None:
    g1 = Sentence(("a", "b", "."), ("X", "X", "PUNCT"), (2, 0, 2), ("nmod:poss", "root", "punct"))
    g2 = Sentence(("c",), ("X",), (0,), ("root",))
    uas, las = attachment_scores(
        [(2, 0, 1), (0,)], [("nmod", "root", "punct"), ("root",)], [g1, g2]
    )
    assert (uas, las) == (0.75, 0.5)  # punctuation counts; nmod differs from nmod:poss
    uas, las = attachment_scores(
        [(2, 0, 1), (0,)], [("nmod", "root", "punct"), ("root",)], [g1, g2], subtypes=False
    )
    assert (uas, las) == (0.75, 0.75)
    with pytest.raises(ValueError, match="expected 3 predicted heads and labels, found 2 and 3"):
        attachment_scores([(2, 0)], [("a", "b", "c")], [g1])
    with pytest.raises(ValueError, match="as many predicted head and label sequences"):
        attachment_scores([], [], [g1])
    with pytest.raises(ValueError, match="at least one word"):
        attachment_scores([], [], [])
