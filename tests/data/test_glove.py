from __future__ import annotations

import gzip
import re
from pathlib import Path

import pytest
import torch

from batchfold.data.glove import GLOVE_URL, glove_file, iter_glove, load_word_vectors
from batchfold.data.paths import find_data
from batchfold.data.sst import load_sst
from batchfold.data.vocab import Vocab

TINY = {
    "the": [0.1, 0.2, 0.3],
    "good": [1.0, -1.0, 0.5],
    "(": [7.0, 8.0, 9.0],
    "film": [-0.25, 0.0, 2.5],
}


def write_gz(file: Path, lines: list[str]) -> Path:
    with gzip.open(file, "wt", encoding="utf-8") as f:
        f.writelines(f"{line}\n" for line in lines)
    return file


def tiny_lines() -> list[str]:
    return [" ".join([word, *map(str, vec)]) for word, vec in TINY.items()]


@pytest.fixture
def tiny_gz(tmp_path: Path) -> Path:
    return write_gz(tmp_path / "glove.6B.3d.sst.txt.gz", tiny_lines())


def test_iter_glove(tiny_gz: Path) -> None:
    assert dict(iter_glove(tiny_gz)) == TINY
    assert dict(iter_glove(str(tiny_gz), dim=3)) == TINY


def test_iter_glove_plain_text(tmp_path: Path) -> None:
    file = tmp_path / "vectors.txt"
    file.write_text("a 1 2\r\nb 3 4 \n", encoding="utf-8")
    assert list(iter_glove(file)) == [("a", [1.0, 2.0]), ("b", [3.0, 4.0])]


@pytest.mark.parametrize(
    ("lines", "dim", "message"),
    [
        (["a 1 2", "b 1 2 3"], None, ":2: expected 2 values after the word 'b', found 3"),
        (["a 1 2", "b 1"], None, ":2: expected 2 values after the word 'b', found 1"),
        (["a 1 2"], 3, ":1: expected 3 values after the word 'a', found 2"),
        (["a"], None, ":1: expected some values after the word 'a', found 0"),
        (["a 1 2", "", "c 1 2"], None, ":2: expected a word and its values, found an empty line"),
        (["a 1 2", "b 1 x"], None, ":2: expected a finite number, found 'x'"),
        (["a 1 nan"], None, ":1: expected a finite number, found 'nan'"),  # read as NaN before
        (["a 1 2", "b -inf 2"], None, ":2: expected a finite number, found '-inf'"),
        (["a 1_000 2"], None, ":1: expected a finite number, found '1_000'"),
        ([" a 1 2"], None, ":1: expected a word and its values, found a space"),
        ([], None, ": no word vectors in it (an empty file)"),  # loaded with 0% coverage before
    ],
)
def test_iter_glove_errors(tmp_path: Path, lines: list[str], dim: int | None, message: str) -> None:
    file = write_gz(tmp_path / "bad.txt.gz", lines)
    with pytest.raises(ValueError, match=f"^{re.escape(str(file) + message)}$"):
        list(iter_glove(file, dim))


def test_load_word_vectors(tiny_gz: Path) -> None:
    vocab = Vocab(["The", "the", "Good", "-LRB-", "unseen", "film"])
    matrix, coverage = load_word_vectors(vocab, tiny_gz, dim=3)
    assert matrix.shape == (len(vocab), 3)
    assert matrix.dtype == torch.float32
    for word in ["The", "the", "Good", "-LRB-", "film"]:
        key = "(" if word == "-LRB-" else word.lower()
        assert matrix[vocab[word]].tolist() == pytest.approx(TINY[key])
    for row in (0, vocab["unseen"]):  # <unk> and the miss are random in the init range
        assert matrix[row].abs().max() <= 0.05
        assert matrix[row].abs().min() > 0
    assert coverage == pytest.approx(5 / 6)


def test_several_dims_side_by_side(tiny_gz: Path) -> None:
    write_gz(tiny_gz.parent / "glove.6B.2d.sst.txt.gz", ["good 5 6", "other 7 8"])
    vocab = Vocab(["good", "the", "other", "unseen"])
    matrix, coverage = load_word_vectors(vocab, tiny_gz.parent, dim=(3, 2), seed=4)
    three, _ = load_word_vectors(vocab, tiny_gz.parent, dim=3, seed=4)
    two, _ = load_word_vectors(vocab, tiny_gz.parent, dim=2, seed=5)
    assert matrix.shape == (len(vocab), 5)
    assert torch.equal(matrix, torch.cat([three, two], dim=1))  # file k: seed + k
    assert matrix[vocab["good"]].tolist() == pytest.approx([*TINY["good"], 5.0, 6.0])
    assert matrix[vocab["other"], 3:].tolist() == pytest.approx([7.0, 8.0])
    assert coverage == pytest.approx(3 / 4)  # found in either file: good, the, other
    with pytest.raises(ValueError, match=r"3d and 2d side by side need a folder .* single file"):
        load_word_vectors(vocab, tiny_gz, dim=(3, 2))


def test_random_rows_are_seeded(tiny_gz: Path) -> None:
    vocab = Vocab(["unseen", "other", "the"])
    a, _ = load_word_vectors(vocab, tiny_gz, dim=3, seed=1)
    b, _ = load_word_vectors(vocab, tiny_gz, dim=3, seed=1)
    c, _ = load_word_vectors(vocab, tiny_gz, dim=3, seed=2, init_range=0.5)
    assert torch.equal(a, b)
    assert not torch.equal(a[:2], c[:2])
    assert c.abs().max() <= 0.5
    assert torch.equal(a[vocab["the"]], c[vocab["the"]])
    # A miss gets the same vector whatever else is in the file.
    empty = write_gz(tiny_gz.parent / "other.txt.gz", ["zzz 0 0 0"])
    d, coverage = load_word_vectors(vocab, empty, dim=3, seed=1)
    assert torch.equal(a[:3], d[:3])
    assert coverage == 0.0


def test_plain_word_list(tiny_gz: Path) -> None:
    matrix, coverage = load_word_vectors(["good", "nope"], tiny_gz, dim=3)
    assert matrix.shape == (2, 3)
    assert matrix[0].tolist() == pytest.approx(TINY["good"])
    assert coverage == 0.5
    empty, coverage = load_word_vectors([], tiny_gz, dim=3)
    assert empty.shape == (0, 3)
    assert coverage == 0.0


def test_folder_lookup(tmp_path: Path, tiny_gz: Path) -> None:
    assert glove_file(tmp_path, dim=3) == tiny_gz
    matrix, coverage = load_word_vectors(Vocab(["film"]), tmp_path, dim=3)
    assert matrix[1].tolist() == pytest.approx(TINY["film"])
    assert coverage == 1.0
    full = tmp_path / "full"
    full.mkdir()
    (full / "glove.6B.3d.txt").write_text("\n".join(tiny_lines()) + "\n", encoding="utf-8")
    assert glove_file(full, dim=3) == full / "glove.6B.3d.txt"


def test_wrong_dimension(tiny_gz: Path) -> None:
    with pytest.raises(ValueError, match=r"glove\.6B\.3d\.sst\.txt\.gz:1: expected 4 values"):
        load_word_vectors(Vocab(["the"]), tiny_gz, dim=4)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(
        FileNotFoundError, match=rf"at .*nowhere\. GloVe 6B comes from {re.escape(GLOVE_URL)}"
    ):
        load_word_vectors(Vocab(["a"]), tmp_path / "nowhere")
    with pytest.raises(
        FileNotFoundError, match=r"glove\.6B\.50d\.sst\.txt\.gz in a folder named glove-sst"
    ):
        glove_file(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"looked for glove\.6B\.300d\.sst\.txt\.gz"):
        glove_file(tmp_path, dim=300)


@pytest.mark.skipif(
    find_data("sst") is None or find_data("glove-sst") is None, reason="SST or GloVe data not found"
)
def test_real_coverage() -> None:
    words = [w for split in ("train", "dev", "test") for t in load_sst(split) for w in t.words()]
    vocab = Vocab(words)
    assert len(vocab) == 21_701 + 1
    matrix, coverage = load_word_vectors(vocab)
    assert matrix.shape == (21_702, 50)
    assert round(coverage * 21_701) == 19_920
    assert 0.91 < coverage < 0.92
    the = next(vec for word, vec in iter_glove(glove_file()) if word == "the")
    assert matrix[vocab["the"]].tolist() == pytest.approx(the)
    assert the[:2] == [0.418, 0.24968]


@pytest.mark.usefixtures("float64")
def test_float32_matrix_under_a_float64_default(tiny_gz: Path) -> None:
    matrix, coverage = load_word_vectors(Vocab(["the", "zzz"]), tiny_gz, dim=3)
    assert matrix.dtype == torch.float32 and coverage == 0.5


def test_a_byte_order_mark_is_no_part_of_the_first_word_and_other_encodings_are_named(
    tmp_path: Path,
) -> None:
    """The first word came back as '\ufeffthe' (its row then random, without a word), and a
    Latin-1 file met a bare UnicodeDecodeError naming no file."""
    file = tmp_path / "bom.txt"
    file.write_text("the 1 2\nof 3 4\n", encoding="utf-8-sig")
    assert [word for word, _ in iter_glove(file)] == ["the", "of"]
    latin = tmp_path / "latin.txt"
    latin.write_bytes("a 1 2\ncaf\u00e9 3 4\n".encode("latin-1"))
    with pytest.raises(ValueError, match=re.escape(f"{latin}: not UTF-8 text")):
        list(iter_glove(latin))
