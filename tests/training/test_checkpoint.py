"""Checkpoints: checked, atomic writes; damaged files are one-line errors naming the file."""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path

import pytest
import torch
from sst_files import TinySST

from batchfold import cli
from batchfold.errors import BatchfoldError, CheckpointError
from batchfold.training import checkpoint, loop

HEADER_START = b"batchfold-checkpoint 1 sha256="


def train_one_epoch(tiny_sst: TinySST, out: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A one-epoch tiny SST run writing ``last.pt`` and ``best.pt`` to ``out``."""
    assert cli.main(tiny_sst.train_argv(out, "--epochs", "1", "--compare-batches", "0")) == 0
    capsys.readouterr()


def leftovers(folder: Path) -> list[str]:
    """Temporary files left in ``folder`` by an interrupted write."""
    return sorted(p.name for p in folder.iterdir() if ".tmp" in p.name)


def flip_bytes(file: Path, offsets: list[int]) -> None:
    data = bytearray(file.read_bytes())
    for offset in offsets:
        data[offset] ^= 0x5A
    file.write_bytes(bytes(data))


def damage(file: Path, how: str) -> None:
    """Damage a checkpoint file the way a full disk, a crash or bad storage would."""
    data = file.read_bytes()
    if how == "missing":
        file.unlink()
    elif how == "empty":
        file.write_bytes(b"")
    elif how == "truncated":
        file.write_bytes(data[: len(data) // 2])
    elif how == "flipped":
        middle = len(data) // 2
        flip_bytes(file, [middle, middle + 7, middle + 23])
    else:
        raise AssertionError(how)


def test_a_checkpoint_round_trips(tmp_path: Path) -> None:
    payload = {"model": {"w": torch.arange(6.0).reshape(2, 3)}, "config": {"a": 1}, "epoch": 3}
    file = tmp_path / "last.pt"
    checkpoint.save_checkpoint(file, payload)
    assert file.read_bytes().startswith(HEADER_START)
    loaded = checkpoint.load_checkpoint(file)
    assert torch.equal(loaded["model"]["w"], payload["model"]["w"])
    assert (loaded["config"], loaded["epoch"]) == ({"a": 1}, 3)
    assert leftovers(tmp_path) == []


def test_training_writes_checked_checkpoints(
    tiny_sst: TinySST, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    train_one_epoch(tiny_sst, out, capsys)
    for name in ("last.pt", "best.pt"):
        assert (out / name).read_bytes().startswith(HEADER_START), name
        assert loop.load_checkpoint(out / name)["epoch"] == 1
    assert (out / "best.pt").read_bytes() == (out / "last.pt").read_bytes()
    assert leftovers(out) == []


@pytest.mark.parametrize("where", ["middle", "checksum", "first byte"])
def test_flipped_bytes_are_detected(
    where: str, tiny_sst: TinySST, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    train_one_epoch(tiny_sst, out, capsys)
    file = out / "last.pt"
    size = file.stat().st_size
    if where == "checksum":  # one hex digit of the header's SHA-256 becomes another
        data = bytearray(file.read_bytes())
        data[40] = ord("0") if data[40] != ord("0") else ord("1")
        file.write_bytes(bytes(data))
    else:
        flip_bytes(file, [size // 2, size // 2 + 5, size // 2 + 40] if where == "middle" else [0])
    problem = "is not a batchfold checkpoint" if where == "first byte" else "is damaged"
    with pytest.raises(BatchfoldError, match=re.escape(f"checkpoint {file} {problem}")) as info:
        loop.load_checkpoint(file)
    assert isinstance(info.value, CheckpointError)


def test_an_empty_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    file = tmp_path / "last.pt"
    file.write_bytes(b"")
    with pytest.raises(BatchfoldError, match=re.escape(f"checkpoint {file} is empty")):
        loop.load_checkpoint(file)


@pytest.mark.parametrize("keep", ["half", "part of the header"])
def test_a_truncated_checkpoint_is_a_clear_error(
    keep: str, tiny_sst: TinySST, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    train_one_epoch(tiny_sst, out, capsys)
    file = out / "best.pt"
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2] if keep == "half" else data[:50])
    with pytest.raises(BatchfoldError, match=re.escape(f"checkpoint {file} ") + ".*truncated"):
        loop.load_checkpoint(file)


def test_a_failed_rename_leaves_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = tmp_path / "last.pt"
    checkpoint.save_checkpoint(file, {"model": {}, "config": {}, "epoch": 1})
    before = file.read_bytes()

    def crash(src: object, dst: object) -> None:
        raise OSError("simulated crash before the rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        checkpoint.save_checkpoint(file, {"model": {}, "config": {}, "epoch": 2})
    assert file.read_bytes() == before
    assert checkpoint.load_checkpoint(file)["epoch"] == 1
    assert leftovers(tmp_path) == []


def test_the_file_is_synced_before_the_rename_and_the_folder_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        events.append(f"replace {Path(src).name} -> {Path(dst).name}")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    checkpoint.save_checkpoint(tmp_path / "best.pt", {"model": {}, "config": {}, "epoch": 1})
    assert events == [
        "fsync file",
        f"replace best.pt.tmp-{os.getpid()} -> best.pt",
        *(["fsync folder"] if os.name != "nt" else []),
    ]


def test_a_crash_while_saving_leaves_a_run_that_resumes(
    tiny_sst: TinySST,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "run"
    train_one_epoch(tiny_sst, out, capsys)
    saved = {name: (out / name).read_bytes() for name in ("last.pt", "best.pt")}
    real_replace = os.replace

    def crash(src: object, dst: object) -> None:
        raise OSError(f"simulated crash renaming onto {dst}")

    monkeypatch.setattr(os, "replace", crash)
    assert cli.main(tiny_sst.train_argv(out, "--resume", "--compare-batches", "0")) == 1
    assert "simulated crash" in capsys.readouterr().err
    assert {name: (out / name).read_bytes() for name in saved} == saved
    assert leftovers(out) == []
    monkeypatch.setattr(os, "replace", real_replace)
    assert cli.main(tiny_sst.train_argv(out, "--resume", "--compare-batches", "0")) == 0
    assert loop.load_checkpoint(out / "last.pt")["epoch"] == 2


def test_an_old_unchecked_checkpoint_loads_with_a_warning(tmp_path: Path) -> None:
    file = tmp_path / "best.pt"
    torch.save({"model": {"w": torch.ones(2)}, "config": {}, "epoch": 4}, file)
    with pytest.warns(UserWarning, match=re.escape(f"checkpoint {file} has no checksum")):
        assert loop.load_checkpoint(file)["epoch"] == 4
    file.write_bytes(file.read_bytes()[:100])
    with (
        pytest.warns(UserWarning, match="no checksum"),
        pytest.raises(CheckpointError, match=re.escape(f"checkpoint {file} cannot be read")),
    ):
        loop.load_checkpoint(file)


def one_line_error(err: str, file: Path) -> str:
    """The error's single line, after checking that it names ``file`` and has no traceback."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert str(file) in lines[0]
    return lines[0]


@pytest.mark.parametrize("how", ["missing", "empty", "truncated", "flipped"])
def test_eval_of_a_bad_checkpoint_is_one_line(
    how: str, tiny_sst: TinySST, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    train_one_epoch(tiny_sst, out, capsys)
    file = out / "best.pt"
    damage(file, how)
    assert cli.main(["eval", "sst", "--checkpoint", str(file)]) == 1
    line = one_line_error(capsys.readouterr().err, file)
    assert line.startswith("batchfold eval sst: error:")
    if how != "missing":
        assert "use another checkpoint" in line


@pytest.mark.parametrize("how", ["missing", "empty", "truncated", "flipped"])
def test_resume_from_a_bad_checkpoint_is_one_line(
    how: str, tiny_sst: TinySST, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    train_one_epoch(tiny_sst, out, capsys)
    file = out / "last.pt"
    damage(file, how)
    assert cli.main(tiny_sst.train_argv(out, "--resume")) == 1
    line = one_line_error(capsys.readouterr().err, file)
    assert line.startswith("batchfold train sst: error:")
    if how != "missing":
        assert f"copy {out / 'best.pt'} over it" in line
        assert "without --resume" in line


@pytest.mark.parametrize("where", ["a file", "under a file", "under a read-only folder"])
def test_an_out_that_cannot_be_written_is_one_line(
    where: str,
    tiny_sst: TinySST,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("not a folder\n")
    if where == "a file":
        out = blocker
    elif where == "under a file":
        out = blocker / "run"
    else:
        read_only = tmp_path / "read-only"
        read_only.mkdir()
        read_only.chmod(0o555)
        out = read_only / "run"
        real_mkdir = os.mkdir

        def mkdir(path: str | os.PathLike[str], mode: int = 0o777) -> None:
            if Path(path).parent == read_only:  # as the kernel does for a user other than root
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
            real_mkdir(path, mode)

        monkeypatch.setattr(os, "mkdir", mkdir)
    assert cli.main(tiny_sst.train_argv(out)) == 1
    line = one_line_error(capsys.readouterr().err, out)
    assert line.startswith("batchfold train sst: error: --out")


def test_eval_of_another_tasks_or_sizes_checkpoint_and_resume_with_fewer_epochs_are_one_line(
    tiny_sst: TinySST, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A checkpoint of another task, or one that another --hidden does not fit, ended in
    load_state_dict's traceback; --resume with fewer epochs than trained kept the weights,
    wrote test results and a config that said otherwise, and exited 0."""
    out = tmp_path / "run"
    train_one_epoch(tiny_sst, out, capsys)
    file = out / "best.pt"
    assert cli.main(["eval", "tagger", "--checkpoint", str(file)]) == 1
    line = one_line_error(capsys.readouterr().err, file)
    assert "a checkpoint of 'sst', not 'tagger'" in line
    assert cli.main(["eval", "sst", "--checkpoint", str(file), "--hidden", "6"]) == 1
    line = one_line_error(capsys.readouterr().err, file)
    assert "does not fit the model" in line and "size mismatch" in line
    config = (out / "config.json").read_text()
    assert cli.main(tiny_sst.train_argv(out, "--resume", "--epochs", "0")) == 1
    line = one_line_error(capsys.readouterr().err, out / "last.pt")
    assert "trained 1 epochs already; give --epochs 1 or more" in line
    assert (out / "config.json").read_text() == config
