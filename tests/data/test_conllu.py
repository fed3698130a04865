from __future__ import annotations

import gzip
import io
import random
import urllib.request
from functools import cache
from pathlib import Path

import pytest

import batchfold.data.conllu as ud
from batchfold.data.conllu import (
    Action,
    ArcHybrid,
    ConlluFormatError,
    LabelSet,
    Sentence,
    action_cost,
    attachment_scores,
    base_relation,
    build_vocabs,
    is_projective,
    load_ud,
    oracle_transitions,
    parse_conllu,
    read_conllu,
)
from batchfold.data.paths import find_data


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
# load_ud: finding, caching and downloading


def test_load_ud_reads_a_given_folder(tmp_path: Path) -> None:
    (tmp_path / "en_ewt-ud-dev.conllu").write_text(SMALL, encoding="utf-8")
    with gzip.open(tmp_path / "xx_tb-ud-test.conllu.gz", "wt", encoding="utf-8") as f:
        f.write(SMALL)
    assert [s.sent_id for s in load_ud("dev", path=tmp_path)] == ["s1", "s2"]
    assert len(load_ud("test", path=tmp_path, treebank="xx_tb")) == 2


def test_load_ud_rejects_unknown_split(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="expected a split among train, dev, test, found 'val'"):
        load_ud("val", path=tmp_path)  # type: ignore[arg-type]


def test_missing_data_with_failed_download_explains_where_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ud, "find_data", lambda name, path=None: None)
    monkeypatch.setenv("BATCHFOLD_CACHE", str(tmp_path / "cache"))

    def offline(url: str, timeout: float = 0) -> io.BytesIO:
        raise OSError("no network here")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(FileNotFoundError) as info:
        load_ud("train")
    message = str(info.value)
    for part in (
        "en_ewt-ud-train.conllu",
        "https://github.com/UniversalDependencies/UD_English-EWT",
        "en_ewt-ud-{train,dev,test}.conllu",
        "path=",
        "$BATCHFOLD_DATA",
        "no network here",
        "raw.githubusercontent.com/UniversalDependencies/UD_English-EWT/master/"
        "en_ewt-ud-train.conllu",
        str(tmp_path / "cache" / "ud-ewt"),
    ):
        assert part in message
    assert not list((tmp_path / "cache" / "ud-ewt").iterdir())  # no partial file left


def test_missing_explicit_folder_does_not_download(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def never(*args: object, **kwargs: object) -> Path:
        raise AssertionError("download attempted")

    monkeypatch.setattr(ud, "download_ud", never)
    with pytest.raises(FileNotFoundError, match=r"en_ewt-ud-dev\.conllu .*was not found"):
        load_ud("dev", path=tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="pass it as path="):
        load_ud("dev", path=tmp_path)


def test_download_goes_to_the_cache_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ud, "find_data", lambda name, path=None: None)
    monkeypatch.setenv("BATCHFOLD_CACHE", str(tmp_path))
    urls: list[str] = []

    def fake(url: str, timeout: float = 0) -> io.BytesIO:
        urls.append(url)
        return io.BytesIO(SMALL.encode("utf-8"))

    monkeypatch.setattr(urllib.request, "urlopen", fake)
    assert len(load_ud("test")) == 2
    assert len(load_ud("test")) == 2  # the second time from the cache
    assert urls == [ud.UD_EWT_URL.format(split="test")]
    assert (tmp_path / "ud-ewt" / "en_ewt-ud-test.conllu").read_text(encoding="utf-8") == SMALL
    assert ud.cache_dir() == tmp_path / "ud-ewt"


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
# The arc-hybrid system and its oracles


def sentence(heads: list[int], labels: list[str] | None = None) -> Sentence:
    n = len(heads)
    deprels = labels or [f"r{i}" for i in range(1, n + 1)]
    return Sentence(
        tuple(f"w{i}" for i in range(1, n + 1)), ("X",) * n, tuple(heads), tuple(deprels)
    )


def rebuild(s: Sentence) -> ArcHybrid:
    config = ArcHybrid(len(s))
    for action, label in oracle_transitions(s):
        assert config.is_legal(action)
        config.apply(action, label)
    assert config.is_terminal()
    return config


def test_arc_hybrid_legality_and_errors() -> None:
    c = ArcHybrid(2)
    assert c.stack == [] and c.buffer == [1, 2, 0] and c.b0 == 1 and not c.is_terminal()
    assert c.legal_actions() == [Action.SHIFT]
    with pytest.raises(ValueError, match="LEFT_ARC is not legal here: expected a non-empty stack"):
        c.apply(Action.LEFT_ARC, "x")
    c.apply(Action.SHIFT)
    c.apply(Action.SHIFT)
    assert c.buffer == [0] and c.b0 == 0
    assert c.legal_actions() == [Action.LEFT_ARC, Action.RIGHT_ARC]
    with pytest.raises(ValueError, match="SHIFT is not legal here: expected a word at the front"):
        c.apply(Action.SHIFT)
    c.apply(Action.RIGHT_ARC, "obj")
    c.apply(Action.LEFT_ARC, "root")
    assert c.is_terminal() and c.legal_actions() == []
    assert c.arcs == [(0, 1, "root"), (1, 2, "obj")]
    with pytest.raises(ValueError, match="word count of at least 0"):
        ArcHybrid(-1)


def test_static_oracle_on_hand_made_trees() -> None:
    cases = [
        [0],
        [2, 0],
        [0, 1],
        [2, 0, 2],
        [0, 1, 2, 3],  # right-branching chain
        [2, 3, 4, 0],  # left-branching chain
        [3, 3, 0, 5, 3, 5],
        [0, 3, 1, 3, 1],
    ]
    for heads in cases:
        s = sentence(heads)
        config = rebuild(s)
        assert tuple(config.heads) == s.heads
        assert tuple(config.labels) == s.deprels
        transitions = oracle_transitions(s)
        assert len(transitions) == 2 * len(heads)
        assert all((label is None) == (a is Action.SHIFT) for a, label in transitions)


def test_static_oracle_rejects_non_projective_trees() -> None:
    with pytest.raises(ValueError, match="expected a projective tree"):
        oracle_transitions(sentence([3, 4, 0, 3]))
    with pytest.raises(ValueError, match="expected a projective tree"):
        oracle_transitions(sentence([3, 0, 2]))


def test_static_oracle_on_random_projective_trees() -> None:
    rng = random.Random(2)
    done = 0
    while done < 500:
        heads = random_tree(rng.randint(1, 12), rng)
        if crosses(heads):
            continue
        s = sentence(heads)
        assert tuple(rebuild(s).heads) == s.heads
        done += 1


def test_dynamic_oracle_agrees_with_static_oracle_and_flags_lost_arcs() -> None:
    # 1 <- 2 -> 3, 2 <- root: "I saw it"
    s = sentence([2, 0, 2], ["nsubj", "root", "obj"])
    gold = list(s.heads)
    config = ArcHybrid(3)
    for action, label in oracle_transitions(s):
        assert action_cost(config, action, gold, label=label, gold_labels=s.deprels) == 0
        config.apply(action, label)

    config = ArcHybrid(3)
    config.apply(Action.SHIFT)  # stack [1], buffer [2, 3, 0]
    assert action_cost(config, Action.LEFT_ARC, gold) == 0
    assert action_cost(config, Action.SHIFT, gold) == 1  # 1 could no longer get head 2
    assert action_cost(config, Action.LEFT_ARC, gold, label="obj", gold_labels=s.deprels) == 1
    config.apply(Action.LEFT_ARC, "nsubj")
    config.apply(Action.SHIFT)
    config.apply(Action.SHIFT)  # stack [2, 3], buffer [0]
    assert action_cost(config, Action.RIGHT_ARC, gold) == 0
    assert action_cost(config, Action.LEFT_ARC, gold) == 1  # 3 attached to the root, not 2

    config = ArcHybrid(3)
    config.apply(Action.SHIFT)
    config.apply(Action.SHIFT)  # stack [1, 2], buffer [3, 0]
    # RIGHT_ARC attaches 2 to 1 and loses 2 <- root and 2 -> 3
    assert action_cost(config, Action.RIGHT_ARC, gold) == 2
    with pytest.raises(ValueError, match="expected 3 gold heads"):
        action_cost(config, Action.SHIFT, [0])
    with pytest.raises(ValueError, match="RIGHT_ARC is not legal"):
        action_cost(ArcHybrid(3), Action.RIGHT_ARC, gold)


def exact_costs(n: int, gold: list[int]):
    """Brute force: the arcs an action makes unreachable, by search over all continuations."""

    @cache
    def best(stack: tuple[int, ...], nxt: int) -> int:
        config = make(stack, nxt)
        if config.is_terminal():
            return 0
        return max(gain(config, a) + best(*after(config, a)) for a in config.legal_actions())

    def make(stack: tuple[int, ...], nxt: int) -> ArcHybrid:
        config = ArcHybrid(n)
        config.stack, config.next = list(stack), nxt
        return config

    def gain(config: ArcHybrid, action: Action) -> int:
        if action is Action.SHIFT:
            return 0
        head = config.b0 if action is Action.LEFT_ARC else config.stack[-2]
        return int(gold[config.stack[-1] - 1] == head)

    def after(config: ArcHybrid, action: Action) -> tuple[tuple[int, ...], int]:
        nxt = config.copy()
        nxt.apply(action)
        return tuple(nxt.stack), nxt.next

    def cost(config: ArcHybrid, action: Action) -> int:
        now = best(tuple(config.stack), config.next)
        return now - gain(config, action) - best(*after(config, action))

    return cost


def test_dynamic_oracle_is_exact_on_projective_trees() -> None:
    rng = random.Random(3)
    checked = 0
    while checked < 3000:
        n = rng.randint(1, 7)
        gold = random_tree(n, rng)
        if crosses(gold):
            continue
        cost = exact_costs(n, gold)
        config = ArcHybrid(n)
        while not config.is_terminal():  # a random walk, mistakes included
            legal = config.legal_actions()
            for action in legal:
                assert action_cost(config, action, gold) == cost(config, action)
                checked += 1
            assert any(action_cost(config, a, gold) == 0 for a in legal)
            config.apply(rng.choice(legal))


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


def test_build_vocabs() -> None:
    sentences = parse_conllu(SMALL)
    v = build_vocabs(sentences)
    assert v.words.words[0] == "<unk>" and v.words.lookup("unseen") == 0
    assert v.words.encode(["know", "zebra"])[1] == 0 and v.words.lookup("know") > 0
    assert v.chars.words[0] == "<unk>" and v.chars.lookup("'") > 0
    assert v.upos.labels == ("AUX", "NOUN", "PART", "PRON", "PUNCT", "VERB")
    assert v.deprels.labels == ("advmod", "aux", "nmod:poss", "nsubj", "punct", "root")
    assert v.upos.decode(v.upos.encode(sentences[0].upos)) == list(sentences[0].upos)
    with pytest.raises(KeyError, match="expected one of the 6 known labels, found 'ADJ'"):
        v.upos.index("ADJ")
    with pytest.raises(ValueError, match="found 'A' twice"):
        LabelSet(["A", "B", "A"])
    assert build_vocabs(sentences + sentences[:1], min_count=2).words.words == [
        "<unk>",
        "I",
        "do",
        "n't",
        "know",
        ".",
    ]


# ----------------------------------------------------------------------------------------------
# The real UD English-EWT data (skipped when it is not on this machine)

EXPECTED = {
    "train": (12_544, 204_577, 288, 280),
    "dev": (2_001, 25_147, 31, 31),
    "test": (2_077, 25_094, 26, 26),
}


@pytest.fixture(scope="module")
def ewt() -> dict[str, list[Sentence]]:
    folder = find_data("ud-ewt")
    if folder is None or not (folder / "en_ewt-ud-train.conllu.gz").is_file():
        pytest.skip("UD English-EWT is not available (see batchfold.data.conllu.load_ud)")
    return {split: load_ud(split, path=folder) for split in ("train", "dev", "test")}


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


def test_real_static_oracle_rebuilds_every_projective_training_tree(
    ewt: dict[str, list[Sentence]],
) -> None:
    rebuilt = 0
    for s in ewt["train"]:
        if not s.is_projective:
            continue
        config = rebuild(s)
        assert tuple(config.heads) == s.heads, s.sent_id
        assert tuple(config.labels) == s.deprels, s.sent_id
        rebuilt += 1
    assert rebuilt == 12_544 - 288


def test_real_vocabs(ewt: dict[str, list[Sentence]]) -> None:
    v = build_vocabs(ewt["train"])
    assert len(v.upos) == 17
    assert len({base_relation(d) for d in v.deprels}) == 36
    dev_words = [w for s in ewt["dev"] for w in s.words]
    unknown = sum(1 for i in v.words.encode(dev_words) if i == 0)
    assert 0 < unknown < 0.1 * len(dev_words)
