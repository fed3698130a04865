from __future__ import annotations

import pickle
import re
import zipfile
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

from batchfold.data import sst
from batchfold.data.paths import cache_dir, find_data
from batchfold.data.sst import SST_URL, SSTFormatError, Tree, load_sst, parse_tree, unescape_word

NBSP = "\u00a0"
SMALL_TREES = [
    "(2 word)",
    "(3 (2 It) (4 works))",
    "(4 (4 (2 A) (4 (3 good) (2 film))) (2 .))",
    "(1 (2 -LRB-) (1 (1 (2 1\\/2) (0 bad)) (2 -RRB-)))",
    "(0 (2 \\*) (0 clichés))",
]


def leaf(label: int, word: str) -> Tree:
    return Tree(label, word, ())


def left_branching(n: int) -> str:
    """A tree of ``n`` internal nodes, each with a leaf as right child: depth ``n``."""
    return "(1 " * n + "(2 w0)" + "".join(f" (3 w{i}))" for i in range(1, n + 1))


@pytest.mark.parametrize("line", SMALL_TREES)
def test_round_trip(line: str) -> None:
    tree = parse_tree(line)
    assert str(tree) == line
    assert parse_tree(str(tree)) == tree
    assert eval(repr(tree), {"parse_tree": parse_tree}) == tree


def test_structure() -> None:
    tree = parse_tree("(4 (4 (2 A) (4 (3 good) (2 film))) (2 .))")
    expected = Tree(
        4,
        None,
        (
            Tree(4, None, (leaf(2, "A"), Tree(4, None, (leaf(3, "good"), leaf(2, "film"))))),
            leaf(2, "."),
        ),
    )
    assert tree == expected
    assert hash(tree) == hash(expected)
    assert tree != parse_tree("(4 (4 (2 A) (4 (3 good) (2 film))) (1 .))")
    assert tree != parse_tree("(4 (2 A) (2 .))")
    assert tree != "(4 (2 A) (2 .))"
    assert not tree.is_leaf
    assert tree.children[1].is_leaf
    assert tree.words() == ["A", "good", "film", "."]
    assert [n.word for n in tree.leaves()] == tree.words()
    assert tree.size == 7
    assert tree.depth == 3
    assert tree.children[1].depth == 0
    assert [n.label for n in tree.nodes()] == [2, 3, 2, 4, 4, 2, 4]
    assert list(tree.nodes())[-1] is tree


def test_unary_internal_node() -> None:
    tree = parse_tree("(3 (3 (2 a) (3 b)))")
    assert len(tree.children) == 1
    assert tree.size == 4
    assert str(tree) == "(3 (3 (2 a) (3 b)))"


def test_spacing_and_line_endings() -> None:
    assert parse_tree("(3 (2 a)(2 b))\r\n") == parse_tree("(3 (2 a) (2 b))")
    assert parse_tree("  (3  (2 a)   (2 b) )  \n") == parse_tree("(3 (2 a) (2 b))")


def test_tree_constructor_checks() -> None:
    with pytest.raises(ValueError, match="1 or 2 children, got 0"):
        Tree(2, None, ())
    with pytest.raises(ValueError, match="1 or 2 children, got 3"):
        Tree(2, None, (leaf(2, "a"), leaf(2, "b"), leaf(2, "c")))
    with pytest.raises(ValueError, match="cannot have children"):
        Tree(2, "a", (leaf(2, "b"),))


def test_pickle() -> None:
    tree = parse_tree(SMALL_TREES[3])
    copy = pickle.loads(pickle.dumps(tree))
    assert copy == tree
    assert str(copy) == SMALL_TREES[3]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("", "t.txt:7:1: expected '(', found end of line"),
        ("x", "t.txt:7:1: expected '(', found 'x'"),
        (")", "t.txt:7:1: expected '(', found ')'"),
        ("(", "t.txt:7:2: expected a label 0-4, found end of line"),
        ("(5 a)", "t.txt:7:2: expected a label 0-4, found '5'"),
        ("(02 a)", "t.txt:7:2: expected a label 0-4, found '02'"),
        ("(-1 a)", "t.txt:7:2: expected a label 0-4, found '-1'"),
        ("(pos a)", "t.txt:7:2: expected a label 0-4, found 'pos'"),
        ("(2 ())", "t.txt:7:5: expected a label 0-4, found ')'"),
        ("(2", "t.txt:7:3: expected a word or '(', found end of line"),
        ("(2 )", "t.txt:7:4: expected a word or '(', found ')'"),
        ("(2 a", "t.txt:7:5: expected ')', found end of line"),
        ("(2 a b)", "t.txt:7:6: expected ')', found 'b'"),
        ("(2 a (2 b))", "t.txt:7:6: expected ')', found '('"),
        ("(2 (2 a)", "t.txt:7:9: expected ')' or '(', found end of line"),
        ("(2 (2 a) b)", "t.txt:7:10: expected ')' or '(', found 'b'"),
        ("(2 (2 a) (2 b)", "t.txt:7:15: expected ')', found end of line"),
        ("(2 (2 a) (2 b) (2 c))", "t.txt:7:16: expected ')', found '('"),
        ("(2 (2 a) (2 b) c)", "t.txt:7:16: expected ')', found 'c'"),
        ("(2 a))", "t.txt:7:6: expected end of line, found ')'"),
        ("(2 a) (2 b)", "t.txt:7:7: expected end of line, found '('"),
        ("(2 a) extra", "t.txt:7:7: expected end of line, found 'extra'"),
    ],
)
def test_error_messages(line: str, message: str) -> None:
    with pytest.raises(SSTFormatError, match=f"^{re.escape(message)}$"):
        parse_tree(line, source="t.txt", line_no=7)


def test_error_is_value_error_with_default_source() -> None:
    with pytest.raises(ValueError, match=r"^<string>:1:5: expected '\)', found end of line$"):
        parse_tree("(2 a")


def test_columns_count_characters() -> None:
    # "é" and the no-break space are one column each.
    with pytest.raises(SSTFormatError, match=r"^f:1:17: expected '\)', found 'x'$"):
        parse_tree(f"(2 (2 é) (2 8{NBSP}1 x))", source="f")


@pytest.mark.parametrize(
    ("word", "plain"),
    [
        ("-LRB-", "("),
        ("-RRB-", ")"),
        ("-LSB-", "["),
        ("-RCB-", "}"),
        ("1\\/2", "1/2"),
        ("\\*", "*"),
        ("\\*\\*\\*", "***"),
        ("and\\/or", "and/or"),
        ("plain", "plain"),
        ("-LRB-x", "-LRB-x"),
    ],
)
def test_unescape_word(word: str, plain: str) -> None:
    assert unescape_word(word) == plain


def test_words_keep_escapes() -> None:
    tree = parse_tree(SMALL_TREES[3])
    assert tree.words() == ["-LRB-", "1\\/2", "bad", "-RRB-"]
    assert [unescape_word(w) for w in tree.words()] == ["(", "1/2", "bad", ")"]


def test_no_break_space_token() -> None:
    token = f"8{NBSP}1\\/2"
    tree = parse_tree(f"(2 {token})")
    assert tree.is_leaf
    assert tree.word == token
    bigger = parse_tree(f"(3 (2 {token}) (3 (2 stars) (2 .)))")
    assert bigger.words() == [token, "stars", "."]
    assert str(bigger) == f"(3 (2 {token}) (3 (2 stars) (2 .)))"
    assert unescape_word(token) == f"8{NBSP}1/2"


def test_deep_tree_without_recursion() -> None:
    n = 10_000
    line = left_branching(n)
    tree = parse_tree(line)
    assert tree.depth == n
    assert tree.size == 2 * n + 1
    assert len(tree.words()) == n + 1
    assert tree.words()[:2] == ["w0", "w1"]
    assert str(tree) == line
    assert tree == parse_tree(line)
    assert hash(tree) == hash(parse_tree(line))
    assert repr(tree).startswith("parse_tree('(1 (1 ")
    assert pickle.loads(pickle.dumps(tree)) == tree
    nodes = list(tree.nodes())
    assert nodes[0].word == "w0"
    assert nodes[-1] is tree
    with pytest.raises(SSTFormatError, match=rf"^<string>:1:{len(line) + 1}: expected end of line"):
        parse_tree(line + ")")
    with pytest.raises(SSTFormatError, match=rf"^<string>:1:{len(line)}: expected '\)', found end"):
        parse_tree(line[:-1])


def write_split(folder: Path, split: str, lines: list[str]) -> None:
    (folder / f"{split}.txt").write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")


def test_load_sst_from_folder(tmp_path: Path) -> None:
    write_split(tmp_path, "train", SMALL_TREES)
    write_split(tmp_path, "dev", SMALL_TREES[:1])
    trees = load_sst("train", path=tmp_path)
    assert [str(t) for t in trees] == SMALL_TREES
    assert load_sst("dev", path=str(tmp_path)) == [parse_tree(SMALL_TREES[0])]


def test_load_sst_reports_file_and_line(tmp_path: Path) -> None:
    write_split(tmp_path, "test", ["(2 a)", "(2 (2 a) (2 b)", "(2 c)"])
    file = tmp_path / "test.txt"
    with pytest.raises(SSTFormatError, match=rf"^{re.escape(str(file))}:2:15: expected '\)'"):
        load_sst("test", path=tmp_path)


def test_load_sst_rejects_blank_lines(tmp_path: Path) -> None:
    write_split(tmp_path, "dev", ["(2 a)", "", "(2 c)"])
    with pytest.raises(SSTFormatError, match=r"dev\.txt:2:1: expected '\(', found end of line$"):
        load_sst("dev", path=tmp_path)


def test_load_sst_unknown_split() -> None:
    with pytest.raises(ValueError, match="unknown SST split 'valid'"):
        load_sst("valid")  # type: ignore[arg-type]


def test_load_sst_missing_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(
        FileNotFoundError, match=rf"no SST folder at .*nowhere\. .*{re.escape(SST_URL)}"
    ):
        load_sst("train", path=missing)


def test_load_sst_empty_folder(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=rf"no train\.txt in .*{re.escape(SST_URL)}"):
        load_sst("train", path=tmp_path)


def test_load_sst_download_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def no_network(url: str, dest: Path) -> None:
        calls.append(url)
        raise OSError("network is unreachable")

    monkeypatch.setattr(sst, "find_data", lambda name, path=None: None)
    monkeypatch.setattr(sst, "_download", no_network)
    monkeypatch.setenv("BATCHFOLD_CACHE", str(tmp_path))
    with pytest.raises(FileNotFoundError) as info:
        load_sst("dev")
    message = str(info.value)
    assert calls == [SST_URL]
    assert SST_URL in message
    assert "network is unreachable" in message
    assert "path=" in message
    assert "$BATCHFOLD_DATA" in message
    assert str(tmp_path / "sst") in message


def test_load_sst_downloads_into_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_download(url: str, dest: Path) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(dest, "w") as zf:
            zf.writestr("trees/", "")
            for split, line in zip(("train", "dev", "test"), SMALL_TREES[:3], strict=True):
                zf.writestr(f"trees/{split}.txt", f"{line}\n")

    monkeypatch.setattr(sst, "find_data", lambda name, path=None: None)
    monkeypatch.setattr(sst, "_download", fake_download)
    monkeypatch.setenv("BATCHFOLD_CACHE", str(tmp_path))
    assert cache_dir("sst") == tmp_path / "sst"
    assert [str(t) for t in load_sst("test")] == [SMALL_TREES[2]]
    assert sorted(p.name for p in (tmp_path / "sst").iterdir()) == [
        "dev.txt",
        "test.txt",
        "train.txt",
    ]

    def must_not_download(url: str, dest: Path) -> None:
        raise AssertionError("the cached copy should have been used")

    monkeypatch.setattr(sst, "_download", must_not_download)
    assert [str(t) for t in load_sst("train")] == [SMALL_TREES[0]]


def test_load_sst_bad_archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_download(url: str, dest: Path) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(b"<html>not a zip</html>")

    monkeypatch.setattr(sst, "find_data", lambda name, path=None: None)
    monkeypatch.setattr(sst, "_download", fake_download)
    monkeypatch.setenv("BATCHFOLD_CACHE", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=re.escape(SST_URL)):
        load_sst("train")


@cache
def real_sst() -> dict[str, list[Tree]] | None:
    if find_data("sst") is None:
        return None
    return {split: load_sst(split) for split in ("train", "dev", "test")}


needs_sst = pytest.mark.skipif(find_data("sst") is None, reason="SST data not found")


@needs_sst
def test_real_sst_counts() -> None:
    data = real_sst()
    assert data is not None
    assert {split: len(trees) for split, trees in data.items()} == {
        "train": 8544,
        "dev": 1101,
        "test": 2210,
    }
    train = data["train"]
    assert sum(t.size for t in train) == 318_582
    assert sum(len(t.leaves()) for t in train) == 163_563
    roots = Counter(t.label for t in train)
    assert [roots[c] for c in range(5)] == [1092, 2218, 1624, 2322, 1288]
    dev_roots = Counter(t.label for t in data["dev"])
    assert [dev_roots[c] for c in range(5)] == [139, 289, 229, 279, 165]
    test_roots = Counter(t.label for t in data["test"])
    assert [test_roots[c] for c in range(5)] == [279, 633, 389, 510, 399]


@needs_sst
def test_real_sst_binary_and_labelled() -> None:
    data = real_sst()
    assert data is not None
    for trees in data.values():
        for tree in trees:
            for node in tree.nodes():
                assert len(node.children) in (0, 2)
                assert 0 <= node.label <= 4


@needs_sst
def test_real_sst_no_break_space_token() -> None:
    data = real_sst()
    assert data is not None
    hits = [w for t in data["train"] for w in t.words() if NBSP in w]
    assert sorted(hits) == [f"2{NBSP}1\\/2", f"2{NBSP}1\\/2", f"8{NBSP}1\\/2"]
    assert len(parse_tree(f"(2 8{NBSP}1\\/2)").leaves()) == 1


def test_a_file_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "sst"
    folder.mkdir()
    for split in ("train", "dev", "test"):
        (folder / f"{split}.txt").write_bytes("(2 (2 caf\u00e9) (2 ok))\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"train.txt: not UTF-8 text"):
        sst.load_sst("train", folder)
