from __future__ import annotations

import gzip
import random
from pathlib import Path

import pytest
from conllu_samples import SMALL, row, word

from batchfold.data.conllu import (
    ConlluFormatError,
    Sentence,
    base_relation,
    is_projective,
    parse_conllu,
    read_conllu,
)


def test_parse_skips_multiword_tokens_and_empty_nodes(tmp_path: Path) -> None:
    plain = tmp_path / "small.conllu"
    plain.write_text(SMALL, encoding="utf-8")
    packed = tmp_path / "small.conllu.gz"
    with gzip.open(packed, "wt", encoding="utf-8") as f:
        f.write(SMALL)
    first, second = read_conllu(plain)
    assert read_conllu(packed) == [first, second] == parse_conllu(SMALL)
    assert first == Sentence(
        ("I", "do", "n't", "know", "."),
        ("PRON", "AUX", "PART", "VERB", "PUNCT"),
        (4, 4, 4, 0, 4),
        ("nsubj", "aux", "advmod", "root", "punct"),
        "s1",
    )
    assert len(first) == 5 and first.is_projective
    assert second.deprels == ("nmod:poss", "root")
    assert second.base_deprels == ("nmod", "root")
    assert base_relation("acl:relcl") == "acl" and base_relation("obj") == "obj"


def test_sentence_stores_tuples_and_checks_lengths() -> None:
    s = Sentence(["a"], ["X"], [0], ["root"])  # type: ignore[arg-type]
    assert s.words == ("a",) and s.heads == (0,) and s.sent_id == ""
    with pytest.raises(ValueError, match="expected as many UPOS tags"):
        Sentence(("a", "b"), ("X",), (0, 1), ("root", "dep"))


def bad(*lines: str, sent_id: str = "bad-1") -> str:
    return f"# sent_id = {sent_id}\n" + "".join(lines) + "\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            bad(word(1, "a", "X", 0, "root"), "2\tb\tb\tX\t_\t_\t1\tdep\t_\n"),
            r"f\.conllu:3: sentence 'bad-1': expected 10 tab-separated columns, found 9",
        ),
        (
            bad(word(1, "a", "X", 0, "root"), word(3, "b", "X", 1, "dep")),
            r"f\.conllu:3: sentence 'bad-1': expected word ID 2, found 3",
        ),
        (
            bad(word(2, "a", "X", 0, "root")),
            r"f\.conllu:2: sentence 'bad-1': expected word ID 1, found 2",
        ),
        (
            bad(word(1, "a", "X", 0, "root"), word(2, "b", "X", 5, "dep")),
            r"f\.conllu:3: sentence 'bad-1': expected a HEAD in 0\.\.2, found 5",
        ),
        (
            bad(word(1, "a", "X", 0, "root"), word(2, "b", "X", "_", "dep")),
            r"f\.conllu:3: .*expected a HEAD in 0\.\.2, found _",
        ),
        (
            bad(word(1, "a", "X", 0, "root"), word(2, "b", "X", 0, "root")),
            r"f\.conllu:3: sentence 'bad-1': expected exactly one root \(HEAD 0\), found 2",
        ),
        (
            bad(word(1, "a", "X", 2, "dep"), word(2, "b", "X", 1, "dep")),
            r"f\.conllu:1: sentence 'bad-1': expected exactly one root \(HEAD 0\), found 0",
        ),
        (
            bad(
                word(1, "a", "X", 0, "root"),
                word(2, "b", "X", 3, "dep"),
                word(3, "c", "X", 2, "dep"),
            ),
            r"f\.conllu:3: sentence 'bad-1': expected every word to lead to the root, "
            r"found a cycle through word 2",
        ),
        (
            bad(word(1, "a", "X", 0, "root"), word("x", "b", "X", 1, "dep")),
            r"f\.conllu:3: sentence 'bad-1': expected a word line of 10 tab-separated columns "
            r"with integer ID and HEAD, found 'x\\tb",
        ),
        (
            bad(word(1, "a", "X", 0, "root"), word(2, "b", "X", 1, "_")),
            r"f\.conllu:3: sentence 'bad-1': expected a DEPREL for word 2, found '_'",
        ),
        (
            bad(word(1, "a", "_", 0, "root")),
            r"f\.conllu:2: sentence 'bad-1': expected a UPOS for word 1, found '_'",
        ),
        (
            bad(row("1-2", "ab", "_", "_", "_", "_", "_", "_", "_", "_")),
            r"f\.conllu:1: sentence 'bad-1': expected at least one word line, found none",
        ),
    ],
)
def test_format_errors_name_file_line_and_expectation(text: str, message: str) -> None:
    with pytest.raises(ConlluFormatError, match=message):
        parse_conllu(text, source="f.conllu")


def test_format_error_line_numbers_count_earlier_sentences(tmp_path: Path) -> None:
    # The first sentence takes lines 1-11 (with its blank line), then come two blank lines,
    # the sent_id comment and the good word: the bad word is on line 15.
    first = SMALL.split("# sent_id = s2")[0]
    text = first + "\n" + bad(word(1, "a", "X", 0, "root"), word(3, "b", "X", 1, "dep"))
    path = tmp_path / "two.conllu"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(
        ConlluFormatError, match=r"two\.conllu:15: sentence 'bad-1': expected word ID 2"
    ):
        read_conllu(path)
    with pytest.raises(ConlluFormatError) as info:
        read_conllu(path)
    assert str(path) in str(info.value) and isinstance(info.value, ValueError)


def test_sentence_without_sent_id_is_named_by_position() -> None:
    text = word(1, "a", "X", 0, "root") + "\n" + word(1, "b", "X", 2, "root") + "\n"
    with pytest.raises(ConlluFormatError, match=r"<string>:3: sentence #2: expected a HEAD"):
        parse_conllu(text)


# ----------------------------------------------------------------------------------------------
# Projectivity


def crosses(heads: list[int] | tuple[int, ...], root_arc: bool = True) -> bool:
    spans = [(min(h, d), max(h, d)) for d, h in enumerate(heads, 1) if root_arc or h != 0]
    return any(a < c < b < d for a, b in spans for c, d in spans)


def random_tree(n: int, rng: random.Random) -> list[int]:
    order = list(range(1, n + 1))
    rng.shuffle(order)
    heads = [0] * n
    for i, w in enumerate(order[1:], start=1):
        heads[w - 1] = rng.choice(order[:i])
    return heads


def test_is_projective_small_cases() -> None:
    assert is_projective([])
    assert is_projective([0])
    assert is_projective([2, 0, 2, 3])
    assert is_projective([0, 1, 1, 1])  # arcs sharing an end point do not cross
    assert not is_projective([3, 4, 0, 3])  # 1 <- 3 and 2 <- 4 cross
    assert not is_projective([3, 0, 2])  # 1 <- 3 passes over the root word 2
    assert is_projective([3, 0, 2], root_arc=False)
    with pytest.raises(ValueError, match="expected a head in 0..2 other than 2, found 2"):
        is_projective([0, 2])
    with pytest.raises(ValueError, match="found 7"):
        is_projective([0, 7])


def test_is_projective_agrees_with_pairwise_crossings() -> None:
    rng = random.Random(1)
    for _ in range(2000):
        heads = random_tree(rng.randint(1, 9), rng)
        assert is_projective(heads) == (not crosses(heads))
        assert is_projective(heads, root_arc=False) == (not crosses(heads, root_arc=False))


def test_is_projective_handles_long_sentences_without_recursion() -> None:
    chain = list(range(2, 20_001)) + [0]  # every word headed by the next one
    assert is_projective(chain)


# ----------------------------------------------------------------------------------------------
# The real UD English-EWT data (skipped when it is not on this machine: see the ewt fixture)

EXPECTED = {
    "train": (12_544, 204_577, 288, 280),
    "dev": (2_001, 25_147, 31, 31),
    "test": (2_077, 25_094, 26, 26),
}


@pytest.mark.parametrize("split", ["train", "dev", "test"])
def test_real_counts(ewt: dict[str, list[Sentence]], split: str) -> None:
    sentences = ewt[split]
    n_sentences, n_words, non_projective, non_projective_without_root = EXPECTED[split]
    assert len(sentences) == n_sentences
    assert sum(len(s) for s in sentences) == n_words
    assert sum(not s.is_projective for s in sentences) == non_projective
    assert (
        sum(not is_projective(s.heads, root_arc=False) for s in sentences)
        == non_projective_without_root
    )
    assert len({tag for s in sentences for tag in s.upos}) == 17
    assert all(s.sent_id for s in sentences)
    assert all(s.heads.count(0) == 1 for s in sentences)
