"""Two processes under torchrun (gloo, CPU) train to the same weights as one process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from sst_files import TinySST

from batchfold.training import distributed
from batchfold.training.checkpoint import load_checkpoint

SRC = Path(__file__).resolve().parents[2] / "src"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(argv: list[str], processes: int) -> subprocess.CompletedProcess[str]:
    """The command under 1 process or torchrun; a launch that fails is tried once more (the
    free port found for the rendezvous may be taken by another process meanwhile)."""
    done = _launch(argv, processes)
    if done.returncode and processes > 1:
        done = _launch(argv, processes)
    return done


def _launch(argv: list[str], processes: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    if processes == 1:
        command = [sys.executable, "-m", "batchfold.cli", *argv]
    else:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc_per_node={processes}",
            "--master_addr=127.0.0.1",
            f"--master_port={_free_port()}",
            "-m",
            "batchfold.cli",
            *argv,
        ]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)


@pytest.mark.parametrize("front_end", ["lazy", "blocks"])
def test_two_processes_train_like_one_on_the_whole_batch(
    tiny_sst: TinySST, tmp_path: Path, front_end: str
) -> None:
    extra = (
        "--epochs",
        "2",
        "--compare-batches",
        "0",
        "--dropout",
        "0",
        "--recurrent-dropout",
        "0",
    )
    extra = (*extra, "--front-end", front_end)
    runs = {}
    for processes in (1, 2):
        out = tmp_path / f"run{processes}"
        done = _run(tiny_sst.train_argv(out, *extra), processes)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[processes] = load_checkpoint(out / "last.pt")
    one, two = runs[1]["model"], runs[2]["model"]
    assert one.keys() == two.keys()
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-4, atol=1e-5, msg=name)
    assert runs[2]["epoch"] == 2


def test_a_run_resumes_with_another_number_of_processes(tiny_sst: TinySST, tmp_path: Path) -> None:
    extra = ("--compare-batches", "0", "--dropout", "0", "--recurrent-dropout", "0")
    out = tmp_path / "run"
    assert _run(tiny_sst.train_argv(out, *extra, "--epochs", "1"), 2).returncode == 0
    done = _run(tiny_sst.train_argv(out, *extra, "--epochs", "2", "--resume"), 1)
    assert done.returncode == 0, done.stderr[-3000:]
    straight = tmp_path / "straight"
    assert _run(tiny_sst.train_argv(straight, *extra, "--epochs", "2"), 1).returncode == 0
    a, b = load_checkpoint(out / "last.pt")["model"], load_checkpoint(straight / "last.pt")["model"]
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5, msg=name)


def test_two_processes_with_dropout_resume_as_if_never_stopped(
    tiny_sst: TinySST, tmp_path: Path
) -> None:
    """Each rank draws its own dropout masks; a resumed run restores each rank's generators,
    where every rank got rank 0's (the same masks on both ranks from the resumed epoch)."""
    extra = ("--compare-batches", "0", "--dropout", "0.3")
    out, straight = tmp_path / "resumed", tmp_path / "straight"
    assert _run(tiny_sst.train_argv(out, *extra, "--epochs", "1"), 2).returncode == 0
    done = _run(tiny_sst.train_argv(out, *extra, "--epochs", "2", "--resume"), 2)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _run(tiny_sst.train_argv(straight, *extra, "--epochs", "2"), 2).returncode == 0
    a, b = load_checkpoint(out / "last.pt")["model"], load_checkpoint(straight / "last.pt")["model"]
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6, msg=name)


def test_shares_cover_a_batch_once() -> None:
    for world in (1, 2, 3, 5):
        for n in (0, 1, 4, 7):
            shares = [distributed.Ranks(r, world).share(list(range(n))) for r in range(world)]
            assert [i for s in shares for i in s] == list(range(n))


def test_the_tagger_trains_alike_on_two_processes(tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "data"))
    from conllu_samples import SMALL  # type: ignore[import-not-found]  # pyright: ignore[reportMissingImports]

    data = tmp_path / "ud"
    data.mkdir()
    for split in ("train", "dev", "test"):
        (data / f"en_ewt-ud-{split}.conllu").write_text(SMALL * 3, encoding="utf-8")
    argv = [
        "train",
        "tagger",
        *("--data", str(data), "--word-dim", "4", "--char-dim", "3", "--hidden", "4"),
        *("--glove", "none", "--layers", "1", "--lr-schedule", "constant"),
        *("--batch-size", "4", "--epochs", "1", "--threads", "1", "--word-dropout", "0"),
        *("--compare-batches", "0"),
    ]
    runs = {}
    for processes in (1, 2):
        out = tmp_path / f"run{processes}"
        done = _run([*argv, "--out", str(out)], processes)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[processes] = load_checkpoint(out / "last.pt")["model"]
    for name in runs[1]:
        torch.testing.assert_close(runs[2][name], runs[1][name], rtol=1e-4, atol=1e-5, msg=name)
