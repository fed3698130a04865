from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from sst_files import TinySST
from torch import Tensor, nn

from batchfold import cli
from batchfold.errors import ConfigError
from batchfold.training import loop
from batchfold.training.checkpoint import save_checkpoint
from batchfold.training.optim import make_average
from batchfold.training.sst import METRICS


def read_jsonl(file: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in file.read_text().splitlines()]


def test_two_epochs_write_every_output(tiny_sst: TinySST, tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert cli.main(tiny_sst.train_argv(out)) == 0
    assert {p.name for p in out.iterdir()} == {
        "config.json",
        "metrics.jsonl",
        "last.pt",
        "best.pt",
        "curves.png",
        "test.json",
        "profile.json",
        "report.html",
    }
    config = json.loads((out / "config.json").read_text())
    assert (config["task"], config["lr"], config["optimizer"], config["hidden"]) == (
        "sst",
        0.05,
        "adagrad",
        4,
    )
    history = read_jsonl(out / "metrics.jsonl")
    assert [r["epoch"] for r in history] == [1, 2]
    for record in history:
        assert set(record) == {"epoch", "train_loss", "items_per_s", "seconds", "dev"}
        assert list(record["dev"]) == list(METRICS)
        assert record["train_loss"] > 0 and record["items_per_s"] > 0
    best_value = max(r["dev"]["root_fine"] for r in history)
    best_epoch = next(r["epoch"] for r in history if r["dev"]["root_fine"] == best_value)
    best = loop.load_checkpoint(out / "best.pt")
    last = loop.load_checkpoint(out / "last.pt")
    assert best["epoch"] == best_epoch and last["epoch"] == 2
    summary = json.loads((out / "test.json").read_text())
    assert summary["best_epoch"] == best_epoch
    assert summary["dev"] == history[best_epoch - 1]["dev"]
    assert list(summary["test"]) == list(METRICS)
    speed = summary["throughput"]
    assert speed["items"] == 4 and speed["speedup"] == pytest.approx(
        speed["batched_per_s"] / speed["one_at_a_time_per_s"]
    )
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_resume_continues_exactly(tiny_sst: TinySST, tmp_path: Path) -> None:
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    dropout = ("--dropout", "0.3")  # dropout draws random numbers: the RNG state must resume
    assert cli.main(tiny_sst.train_argv(straight, *dropout)) == 0
    assert cli.main(tiny_sst.train_argv(resumed, *dropout, "--epochs", "1")) == 0
    assert loop.load_checkpoint(resumed / "last.pt")["epoch"] == 1
    assert cli.main(tiny_sst.train_argv(resumed, *dropout, "--resume")) == 0
    a, b = loop.load_checkpoint(straight / "last.pt"), loop.load_checkpoint(resumed / "last.pt")
    assert a["epoch"] == b["epoch"] == 2
    assert a["model"].keys() == b["model"].keys()
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
    for p, q in zip(
        a["optimizer"]["state"].values(), b["optimizer"]["state"].values(), strict=True
    ):
        assert all(torch.equal(torch.as_tensor(p[k]), torch.as_tensor(q[k])) for k in p)
    dev = [[r["dev"] for r in read_jsonl(run / "metrics.jsonl")] for run in (straight, resumed)]
    assert dev[0] == dev[1] and len(dev[0]) == 2


def test_resume_refuses_changed_options(
    tiny_sst: TinySST, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert cli.main(tiny_sst.train_argv(out, "--epochs", "1", "--compare-batches", "0")) == 0
    assert cli.main(tiny_sst.train_argv(out, "--resume", "--hidden", "6")) == 1
    err = capsys.readouterr().err
    assert "--resume from" in err and "hidden: 4 -> 6" in err


def test_resume_needs_a_checkpoint(
    tiny_sst: TinySST, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(tiny_sst.train_argv(tmp_path / "empty", "--resume")) == 1
    assert f"--resume: no checkpoint at {tmp_path / 'empty' / 'last.pt'}" in capsys.readouterr().err


def test_shuffled_batches_depend_on_seed_and_epoch_only() -> None:
    one = loop.shuffled_batches(10, 3, seed=5, epoch=1)
    assert one == loop.shuffled_batches(10, 3, seed=5, epoch=1)
    assert one != loop.shuffled_batches(10, 3, seed=5, epoch=2)
    assert sorted(i for b in one for i in b) == list(range(10))
    with pytest.raises(loop.ConfigError, match="--batch-size must be at least 1, got 0"):
        loop.shuffled_batches(10, 0, seed=5, epoch=1)


class LinearTask:
    """A task with no trees at all: the loop must not care what the items are."""

    name = "linear"
    best_metric = "neg_mse"
    unit = "points"

    def __init__(self, scale: float = 1.0) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(40, 3, generator=generator)
        self.y = self.x @ torch.tensor([1.0, -2.0, 0.5]) * scale

    def train_items(self) -> list[int]:
        return list(range(30))

    def build_model(self) -> nn.Module:
        return nn.Linear(3, 1)

    def param_groups(self, model: nn.Module, lr: float) -> list[dict[str, Any]]:
        return [{"params": list(model.parameters())}]

    def loss(self, model: nn.Module, batch: Sequence[int]) -> tuple[Tensor, int]:
        index = torch.tensor(list(batch))
        error = model(self.x[index]).squeeze(-1) - self.y[index]
        return (error**2).sum(), len(batch)

    def evaluate(self, model: nn.Module, split: str) -> dict[str, float]:
        rows = slice(30, 35) if split == "dev" else slice(35, 40)
        return {"neg_mse": -float(((model(self.x[rows]).squeeze(-1) - self.y[rows]) ** 2).mean())}


def linear_args(out: Path, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    loop.add_arguments(parser, "linear")
    return parser.parse_args(["--out", str(out), "--epochs", "3", "--batch-size", "8", *extra])


def test_the_loop_runs_any_task(tmp_path: Path) -> None:
    summary = loop.train(LinearTask(), linear_args(tmp_path, "--optimizer", "adam", "--lr", "0.1"))
    history = read_jsonl(tmp_path / "metrics.jsonl")
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert summary["throughput"] is None  # no eager baseline to compare with
    assert summary["test"].keys() == {"neg_mse"}
    assert json.loads((tmp_path / "config.json").read_text())["lr"] == 0.1


def test_a_fresh_run_leaves_nothing_of_an_earlier_run_to_resume(tmp_path: Path) -> None:
    """A fresh start in a used folder that stops in its first epoch left the earlier run's
    last.pt, and --resume went on from that run's weights and epochs."""
    loop.train(LinearTask(), linear_args(tmp_path))
    assert (tmp_path / "last.pt").is_file() and (tmp_path / "test.json").is_file()
    with pytest.raises(FloatingPointError):  # a fresh run that stops in its first epoch
        loop.train(LinearTask(scale=1e30), linear_args(tmp_path))
    for name in ("last.pt", "best.pt", "test.json", "curves.png"):
        assert not (tmp_path / name).exists(), name
    with pytest.raises(ConfigError, match="no checkpoint"):
        loop.train(LinearTask(), linear_args(tmp_path, "--resume"))


def test_a_refused_option_leaves_the_run_in_the_folder(tmp_path: Path) -> None:
    """The fresh start cleared the folder before ``--min-lr-scale`` was checked."""
    loop.train(LinearTask(), linear_args(tmp_path))
    with pytest.raises(ConfigError, match="--min-lr-scale"):
        loop.train(LinearTask(), linear_args(tmp_path, "--min-lr-scale", "1.5"))
    assert (tmp_path / "last.pt").is_file() and (tmp_path / "test.json").is_file()


def test_a_last_line_cut_short_does_not_stop_a_resume(tmp_path: Path) -> None:
    """An append to metrics.jsonl cut short (a crash) made --resume fail on its JSON."""
    loop.train(LinearTask(), linear_args(tmp_path, "--epochs", "2"))
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"epoch": 3, "train_lo')
    loop.train(LinearTask(), linear_args(tmp_path, "--epochs", "3", "--resume"))
    assert [r["epoch"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2, 3]


def test_a_diverging_loss_stops_with_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FloatingPointError, match="the linear loss is inf at epoch 1, batch 1"):
        loop.train(LinearTask(scale=1e30), linear_args(tmp_path))


def test_cosine_schedule_sets_each_epochs_rate_and_fixes_the_epoch_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cosine = ("--optimizer", "adam", "--lr", "0.1", "--lr-schedule", "cosine", "--epochs", "3")
    loop.train(LinearTask(), linear_args(tmp_path / "straight", *cosine))
    history = read_jsonl(tmp_path / "straight" / "metrics.jsonl")
    assert [r["lr_scale"] for r in history] == pytest.approx([1.0, 0.5, 0.0])
    state = loop.load_checkpoint(tmp_path / "straight" / "last.pt")
    assert state["optimizer"]["param_groups"][0]["lr"] == pytest.approx(0.0)
    assert state["optimizer"]["param_groups"][0]["initial_lr"] == 0.1

    resumed = tmp_path / "resumed"
    first = linear_args(resumed, *cosine)
    first.epochs = 2  # stop early by hand: --epochs may not change on resume with a schedule
    loop.train(LinearTask(), first)
    with pytest.raises(loop.ConfigError, match="epochs: 2 -> 3"):
        loop.train(LinearTask(), linear_args(resumed, *cosine, "--resume"))
    # without a schedule the same change is allowed, as before
    loop.train(LinearTask(), linear_args(tmp_path / "plain", "--epochs", "2"))
    loop.train(LinearTask(), linear_args(tmp_path / "plain", "--epochs", "3", "--resume"))
    # the schedule is a function of the epoch: a run stopped after epoch 2 and resumed ends
    # where the uninterrupted one did
    stopped = tmp_path / "stopped"
    real_epoch = loop._train_epoch

    def stop_at_third(*args: Any) -> Any:
        if args[5] == 3:
            raise KeyboardInterrupt
        return real_epoch(*args)

    monkeypatch.setattr(loop, "_train_epoch", stop_at_third)
    with pytest.raises(KeyboardInterrupt):
        loop.train(LinearTask(), linear_args(stopped, *cosine))
    monkeypatch.setattr(loop, "_train_epoch", real_epoch)
    loop.train(LinearTask(), linear_args(stopped, *cosine, "--resume"))
    a = loop.load_checkpoint(tmp_path / "straight" / "last.pt")["model"]
    b = loop.load_checkpoint(stopped / "last.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    lr_scales = [r["lr_scale"] for r in read_jsonl(stopped / "metrics.jsonl")]
    assert lr_scales == pytest.approx([1.0, 0.5, 0.0])


def test_constant_schedule_with_weight_decay_shrinks_the_weights(tmp_path: Path) -> None:
    plain = ("--optimizer", "adam", "--lr", "0.1", "--epochs", "3")
    loop.train(LinearTask(), linear_args(tmp_path / "plain", *plain))
    loop.train(LinearTask(), linear_args(tmp_path / "decay", *plain, "--weight-decay", "10"))
    norms = [
        loop.load_checkpoint(tmp_path / run / "last.pt")["model"]["weight"].norm().item()
        for run in ("plain", "decay")
    ]
    assert norms[1] < norms[0]
    assert "lr_scale" not in read_jsonl(tmp_path / "plain" / "metrics.jsonl")[0]


def test_checkpoints_from_before_the_schedule_options_resume_at_a_constant_rate(
    tmp_path: Path,
) -> None:
    out = tmp_path / "old"
    loop.train(LinearTask(), linear_args(out, "--epochs", "2"))
    state = loop.load_checkpoint(out / "last.pt")
    for key in (
        "lr_schedule",
        "min_lr_scale",
        "weight_decay",
        "ema",
        "keep",
    ):  # as an earlier batchfold saved
        del state["config"][key]
    save_checkpoint(out / "last.pt", state)
    loop.train(LinearTask(), linear_args(out, "--epochs", "3", "--resume"))
    assert [r["epoch"] for r in read_jsonl(out / "metrics.jsonl")] == [1, 2, 3]
    with pytest.raises(loop.ConfigError, match="lr_schedule: 'constant' -> 'cosine'"):
        loop.train(
            LinearTask(), linear_args(out, "--epochs", "4", "--lr-schedule", "cosine", "--resume")
        )


class RecordingTask(LinearTask):
    """:class:`LinearTask` that keeps the trained model's weights at every loss: those after
    the step before."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Tensor] = []

    def loss(self, model: nn.Module, batch: Sequence[int]) -> tuple[Tensor, int]:
        self.seen.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
        return super().loss(model, batch)


def test_ema_evaluates_keeps_and_resumes_the_moving_average(tmp_path: Path) -> None:
    ema = ("--optimizer", "adam", "--lr", "0.1", "--ema", "0.5")
    task = RecordingTask()
    loop.train(task, linear_args(tmp_path / "straight", *ema))
    state = loop.load_checkpoint(tmp_path / "straight" / "last.pt")
    trained = torch.cat([state["trained"]["weight"].flatten(), state["trained"]["bias"]])
    # the weights after each of the 12 steps (the profile at the end calls the loss again)
    after = [*task.seen[1:12], trained]
    average = after[0]
    for weights in after[1:]:
        average = 0.5 * average + 0.5 * weights
    kept = torch.cat([state["model"]["weight"].flatten(), state["model"]["bias"]])
    torch.testing.assert_close(kept, average)
    assert state["averaged_steps"] == len(after) == 12
    assert not torch.allclose(kept, trained)
    model = LinearTask().build_model()
    model.load_state_dict(state["model"])
    dev = read_jsonl(tmp_path / "straight" / "metrics.jsonl")[-1]["dev"]
    with torch.no_grad():
        assert dev == LinearTask().evaluate(model, "dev")  # dev saw the average

    resumed = tmp_path / "resumed"
    loop.train(LinearTask(), linear_args(resumed, *ema, "--epochs", "2"))
    loop.train(LinearTask(), linear_args(resumed, *ema, "--resume"))
    again = loop.load_checkpoint(resumed / "last.pt")
    for key in ("model", "trained"):
        assert all(torch.equal(state[key][k], again[key][k]) for k in state[key]), key
    with pytest.raises(loop.ConfigError, match=r"--ema must be in \[0, 1\), got 1.0"):
        loop.train(LinearTask(), linear_args(tmp_path / "bad", "--ema", "1"))


def test_ema_averages_floating_weights_and_keeps_counts() -> None:
    model = nn.BatchNorm1d(3)  # weights and running stats are floats; the batch count is not
    average = make_average(model, 0.5)
    assert average is not None
    for step in range(3):
        model(torch.full((4, 3), float(step)) + torch.arange(4.0)[:, None])
        model.weight.data.fill_(2.0 * step)
        average.update_parameters(model)
    kept, now = dict(average.module.state_dict()), model.state_dict()
    assert kept["num_batches_tracked"].item() == now["num_batches_tracked"].item() == 3
    torch.testing.assert_close(kept["weight"], torch.full((3,), 0.25 * 0 + 0.25 * 2 + 0.5 * 4))
    assert not torch.equal(kept["running_mean"], now["running_mean"])


class WorseningTask(LinearTask):
    """:class:`LinearTask` whose dev metric falls every epoch, so that epoch 1 is the best."""

    def __init__(self) -> None:
        super().__init__()
        self.dev_calls = 0

    def evaluate(self, model: nn.Module, split: str) -> dict[str, float]:
        if split != "dev":
            return super().evaluate(model, split)
        self.dev_calls += 1
        return {"neg_mse": -float(self.dev_calls)}


@pytest.mark.parametrize("keep", ["best", "last"])
def test_keep_tests_the_best_or_the_last_epochs_weights(
    tmp_path: Path, keep: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = linear_args(tmp_path, "--optimizer", "adam", "--lr", "0.1", "--keep", keep)
    summary = loop.train(WorseningTask(), args)
    printed = capsys.readouterr().out
    assert ("last epoch 3: dev" if keep == "last" else "best epoch 1: dev") in printed
    assert summary["keep"] == keep
    card = "epoch (the last)" if keep == "last" else "best dev epoch"
    assert card in (tmp_path / "report.html").read_text()
    kept = loop.load_checkpoint(tmp_path / "best.pt")
    last = loop.load_checkpoint(tmp_path / "last.pt")
    epoch = 1 if keep == "best" else 3
    assert summary["best_epoch"] == kept["epoch"] == epoch
    assert summary["dev"] == {"neg_mse": -float(epoch)}
    same = all(torch.equal(kept["model"][k], last["model"][k]) for k in last["model"])
    assert same == (keep == "last")
    model = LinearTask().build_model()
    model.load_state_dict(kept["model"])
    with torch.no_grad():
        assert summary["test"] == LinearTask().evaluate(model, "test")
