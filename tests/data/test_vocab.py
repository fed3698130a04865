from __future__ import annotations

import pickle

import pytest

from batchfold.data.vocab import UNK, Vocab


def test_ids_by_count_then_first_seen() -> None:
    vocab = Vocab(["b", "a", "c", "a", "b", "a", "d"])
    assert vocab.words == [UNK, "a", "b", "c", "d"]
    assert len(vocab) == 5
    assert [vocab[w] for w in vocab.words] == [0, 1, 2, 3, 4]
    assert list(vocab) == vocab.words


def test_unknown_words() -> None:
    vocab = Vocab(["x"])
    assert vocab["nope"] == 0
    assert vocab.lookup("nope") == 0
    assert vocab.lookup("x") == 1
    assert vocab.encode(["x", "nope", "x"]) == [1, 0, 1]
    assert "x" in vocab
    assert "nope" not in vocab
    assert UNK in vocab
    assert 3 not in vocab
    assert Vocab.unk_id == 0


def test_min_count() -> None:
    vocab = Vocab(["a", "a", "a", "b", "b", "c"], min_count=2)
    assert vocab.words == [UNK, "a", "b"]
    assert vocab["c"] == 0
    assert Vocab(["a", "b"], min_count=3).words == [UNK]
    with pytest.raises(ValueError, match="min_count must be at least 1, got 0"):
        Vocab(["a"], min_count=0)


def test_unk_in_input_is_not_repeated() -> None:
    vocab = Vocab([UNK, "a", UNK])
    assert vocab.words == [UNK, "a"]


def test_empty() -> None:
    vocab = Vocab()
    assert len(vocab) == 1
    assert vocab["anything"] == 0


def test_case_sensitive() -> None:
    vocab = Vocab(["The", "the"])
    assert vocab["The"] != vocab["the"]
    assert len(vocab) == 3


def test_state_dict_round_trip() -> None:
    vocab = Vocab(["z", "y", "y", "x", "x", "x"])
    state = vocab.state_dict()
    assert state == [UNK, "x", "y", "z"]
    state.append("changed")  # a copy: the vocabulary is unaffected
    assert len(vocab) == 4
    restored = Vocab.from_state_dict(vocab.state_dict())
    assert restored == vocab
    assert restored["y"] == 2
    assert Vocab.from_state_dict([UNK, "q", "p"]).words == [UNK, "q", "p"]


def test_from_state_dict_checks() -> None:
    with pytest.raises(ValueError, match="must start with '<unk>', found an empty list"):
        Vocab.from_state_dict([])
    with pytest.raises(ValueError, match="must start with '<unk>', found 'a'"):
        Vocab.from_state_dict(["a", UNK])
    with pytest.raises(ValueError, match="repeats the word 'b'"):
        Vocab.from_state_dict([UNK, "b", "c", "b"])


def test_pickle() -> None:
    vocab = Vocab(["one", "two", "two"])
    copy = pickle.loads(pickle.dumps(vocab))
    assert copy == vocab
    assert copy["two"] == 1
    assert copy["three"] == 0


def test_equality_and_repr() -> None:
    assert Vocab(["a"]) == Vocab(["a"])
    assert Vocab(["a"]) != Vocab(["b"])
    assert Vocab(["a"]) != ["<unk>", "a"]
    assert repr(Vocab(["a"])) == "Vocab(2 words: ['<unk>', 'a'])"
    assert repr(Vocab(["a", "b", "c", "d", "e", "f"])).endswith(", ...])")
