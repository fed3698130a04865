from __future__ import annotations

import gzip
import io
import urllib.request
from pathlib import Path

import pytest
from conllu_samples import SMALL

import batchfold.data.ud as ud
from batchfold.data.conllu import Sentence, base_relation, parse_conllu
from batchfold.data.paths import cache_dir
from batchfold.data.ud import build_vocabs, load_ud
from batchfold.data.vocab import LabelSet

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
    assert cache_dir("ud-ewt") == tmp_path / "ud-ewt"


# ----------------------------------------------------------------------------------------------
# Vocabularies


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
# The real UD English-EWT data (skipped when it is not on this machine: see the ewt fixture)


def test_real_vocabs(ewt: dict[str, list[Sentence]]) -> None:
    v = build_vocabs(ewt["train"])
    assert len(v.upos) == 17
    assert len({base_relation(d) for d in v.deprels}) == 36
    dev_words = [w for s in ewt["dev"] for w in s.words]
    unknown = sum(1 for i in v.words.encode(dev_words) if i == 0)
    assert 0 < unknown < 0.1 * len(dev_words)
