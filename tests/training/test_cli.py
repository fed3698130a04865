from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from sst_files import TinySST

from batchfold import cli
from batchfold.training.sst import METRICS


def test_top_level_help_lists_commands_and_tasks(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in [*cli.COMMANDS, *cli.TASKS]:
        assert name in out


def test_task_help_explains_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    for command in cli.TASK_COMMANDS:
        parser = cli.build_parser(command, "sst")
        undocumented = [
            action.option_strings
            for action in parser._actions  # the only way to list them
            if action.option_strings and not action.help
        ]
        assert undocumented == []
        with pytest.raises(SystemExit) as exit_info:
            cli.main([command, "sst", "--help"])
        assert exit_info.value.code == 0
        out = capsys.readouterr().out
        assert f"usage: batchfold {command} sst" in out
        if command == "train":
            for option in ("--optimizer", "--lr", "--resume", "--hidden", "--embed-lr-scale"):
                assert option in out


def test_train_options_parse_with_task_defaults() -> None:
    args = cli.build_parser("train", "sst").parse_args(
        ["--optimizer", "adam", "--cell", "treernn", "--max-train", "10", "--scheduler", "depth"]
    )
    assert (args.optimizer, args.cell, args.max_train, args.scheduler) == (
        "adam",
        "treernn",
        10,
        "depth",
    )
    assert (args.batch_size, args.epochs, args.lr, args.out) == (25, 30, None, "runs/sst")
    assert (args.lr_schedule, args.word_dim, args.hidden, args.embed_lr_scale) == (
        "cosine",
        150,
        300,
        2.0,
    )
    assert (args.dropout, args.recurrent_dropout) == (0.5, None)  # None: 0.1 for a Tree-LSTM


def test_bad_option_value_is_rejected() -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.build_parser("train", "sst").parse_args(["--optimizer", "sgd"])
    assert exit_info.value.code == 2


@pytest.mark.parametrize("option", ["--max-train", "--max-eval"])
@pytest.mark.parametrize("value", ["0", "-800"])
def test_item_counts_below_one_are_rejected(
    option: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``items[:-800]`` kept all but the last 800 items; ``[:0]`` trained on nothing."""
    with pytest.raises(SystemExit) as exit_info:
        cli.build_parser("train", "esol").parse_args([option, value])
    assert exit_info.value.code == 2
    assert f"{option}: expected at least 1, got {value}" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("command", ["train", "eval"])
def test_a_device_this_machine_lacks_is_refused_before_anything_runs(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``train`` ended in an AssertionError from model.to('cuda') after the data was read;
    ``eval`` called a healthy checkpoint damaged."""
    extra = ["--out", str(tmp_path)] if command == "train" else ["--checkpoint", "missing.pt"]
    assert cli.main([command, "esol", "--device", "cuda", *extra]) == 1
    assert "--device cuda: this machine has 0 CUDA device(s)" in capsys.readouterr().err
    assert cli.main([command, "esol", "--device", "gpu3", *extra]) == 1
    assert "--device gpu3: not a torch device" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("error", "code", "message"),
    [
        (FloatingPointError("the esol loss is nan"), 1, "error: the esol loss is nan"),
        (KeyboardInterrupt(), 130, "interrupted; a training run goes on"),
    ],
)
def test_a_diverging_or_interrupted_run_ends_in_one_line(
    error: BaseException,
    code: int,
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def fail(*_: object) -> int:
        raise error

    monkeypatch.setattr(cli, "_run", fail)
    assert cli.main(["train", "esol"]) == code
    err = capsys.readouterr().err
    assert err.count("\n") <= 2 and message in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["fit", "sst"], "unknown command 'fit'"),
        (["train"], "'batchfold train' needs a task"),
        (["train", "poetry"], "unknown task 'poetry'"),
    ],
)
def test_unknown_command_or_task(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_missing_task_module_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(cli.TASKS, "ghost", "batchfold.training.no_such_module")
    assert cli.main(["train", "ghost"]) == 2
    err = capsys.readouterr().err
    assert "the task 'ghost' is not available" in err
    assert "batchfold.training.no_such_module" in err


def test_missing_data_names_where_to_get_sst(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = cli.main(["train", "sst", "--data", str(tmp_path / "nowhere"), "--out", str(tmp_path)])
    assert status == 1
    err = capsys.readouterr().err
    assert f"no SST folder at {tmp_path / 'nowhere'}" in err
    assert "https://nlp.stanford.edu/sentiment/trainDevTestTrees_PTB.zip" in err


def test_eval_prints_the_four_accuracies_of_the_checkpoint(
    tiny_sst: TinySST, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert cli.main(tiny_sst.train_argv(out)) == 0
    summary = json.loads((out / "test.json").read_text())
    capsys.readouterr()
    assert cli.main(["eval", "sst", "--checkpoint", str(out / "best.pt")]) == 0
    printed = capsys.readouterr().out
    assert f"sst test, checkpoint {out / 'best.pt'}:" in printed
    rows = dict(line.split() for line in printed.splitlines() if line.startswith("  "))
    assert list(rows) == list(METRICS)
    for name in METRICS:  # the same numbers train wrote for the best checkpoint
        assert float(rows[name]) == pytest.approx(summary["test"][name], abs=0.005)


def test_eval_runtime_options_are_not_taken_from_the_checkpoint(
    tiny_sst: TinySST, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    argv = tiny_sst.train_argv(out, "--epochs", "1", "--compare-batches", "0", "--max-eval", "2")
    assert cli.main(argv) == 0
    capsys.readouterr()
    checkpoint = str(out / "last.pt")
    assert cli.main(["eval", "sst", "--checkpoint", checkpoint, "--split", "dev"]) == 0
    printed = capsys.readouterr().out
    assert "sst: 16 train, 6 dev, 7 test trees" in printed  # all of dev, not the 2 of training
    assert f"sst dev, checkpoint {checkpoint}:" in printed
