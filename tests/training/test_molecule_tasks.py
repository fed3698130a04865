"""The esol and tox21 jobs: losses, metrics, front ends and tiny runs through the CLI."""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
from pathlib import Path

import pytest
import torch

from batchfold import cli
from batchfold.data.molecules import ESOL_TARGET, TOX21_TASKS
from batchfold.training import loop
from batchfold.training.esol import ESOLTask, regression_metrics
from batchfold.training.molecules import MoleculeTask
from batchfold.training.run_folder import as_saved
from batchfold.training.tox21 import Tox21Task, masked_bce, mean_roc_auc, roc_auc

SMILES = [
    "C", "CC", "CCO", "CCN", "CCCl", "CC(=O)O", "c1ccccc1", "c1ccccc1O", "c1ccncc1", "CCOC",
    "CC(C)C", "C1CCCCC1", "OCC(O)CO", "CC#N", "ClC(Cl)Cl", "CCCCCC", "c1ccc2ccccc2c1", "CC(N)=O",
    "O=C=O", "CCS", "Brc1ccccc1", "CC(C)(C)O", "C=CC=C", "NCCN", "OC1CCCC1", "CC(=O)[O-].[Na+]",
    "FC(F)F", "c1cc[nH]c1", "CCOC(C)=O", "N#Cc1ccccc1",
]  # fmt: skip


def write_esol(folder: Path) -> Path:
    rng = random.Random(0)
    rows = [f"{s},{rng.uniform(-6, 1):.3f},{i}" for i, s in enumerate(SMILES)]
    file = folder / "delaney-processed.csv"
    file.write_text(f"smiles,{ESOL_TARGET},id\n" + "\n".join(rows) + "\n")
    return file


def write_tox21(folder: Path) -> Path:
    rng = random.Random(1)
    rows = []
    for i, s in enumerate(SMILES):
        cells = [rng.choice(["0", "1", ""]) for _ in TOX21_TASKS]
        rows.append(",".join([*cells, f"mol{i}", s]))
    file = folder / "tox21.csv"
    file.write_text(",".join([*TOX21_TASKS, "mol_id", "smiles"]) + "\n" + "\n".join(rows) + "\n")
    return file


def options(task: str, data: Path, *extra: str) -> argparse.Namespace:
    args = cli.build_parser("train", task).parse_args(
        ["--data", str(data), "--atom-dim", "6", "--pair-dim", "5", "--gather-dim", "4",
         "--hidden", "4", *extra]
    )  # fmt: skip
    args.task = task
    return args


def test_the_tox21_loss_ignores_missing_labels():
    torch.manual_seed(0)
    logits = torch.randn(5, 12, requires_grad=True)
    labels = torch.randint(0, 2, (5, 12)).float()
    mask = torch.rand(5, 12) < 0.6
    loss, count = masked_bce(logits, labels, mask)
    assert count == int(mask.sum())
    measured = torch.nn.functional.binary_cross_entropy_with_logits(
        logits[mask], labels[mask], reduction="sum"
    )
    torch.testing.assert_close(loss, measured)
    (grad,) = torch.autograd.grad(loss, logits)
    assert bool((grad[~mask] == 0).all()) and bool((grad[mask] != 0).all())
    flipped, _ = masked_bce(logits, torch.where(mask, labels, 1 - labels), mask)
    assert flipped.item() == loss.item()
    with pytest.raises(ValueError, match="one shape"):
        masked_bce(logits, labels[:2], mask)


def test_roc_auc_counts_ordered_pairs_with_ties_as_half():
    rng = random.Random(2)
    for _ in range(20):
        n = rng.randint(2, 12)
        scores = torch.tensor([float(rng.randint(0, 4)) for _ in range(n)])  # many ties
        labels = torch.tensor([rng.randint(0, 1) for _ in range(n)])
        pos = [s for s, y in zip(scores.tolist(), labels.tolist(), strict=True) if y]
        neg = [s for s, y in zip(scores.tolist(), labels.tolist(), strict=True) if not y]
        if not pos or not neg:
            assert math.isnan(roc_auc(scores, labels))
            continue
        wins = sum(1.0 if p > q else 0.5 if p == q else 0.0 for p, q in itertools.product(pos, neg))
        assert roc_auc(scores, labels) == pytest.approx(wins / (len(pos) * len(neg)))


def test_mean_roc_auc_skips_tasks_with_one_class():
    scores = torch.tensor([[0.9, 0.1, 0.3], [0.2, 0.8, 0.2], [0.5, 0.3, 0.1]])
    labels = torch.tensor([[1, 0, 1], [0, 1, 1], [0, 0, 1]])
    mask = torch.ones(3, 3, dtype=torch.bool)
    assert mean_roc_auc(scores, labels, mask) == pytest.approx((1.0 + 1.0) / 2)
    with pytest.raises(ValueError, match="no task has both classes"):  # not a NaN metric
        mean_roc_auc(scores[:, 2:], labels[:, 2:], mask[:, 2:])


def test_esol_standardises_on_the_molecules_it_trains_on(tmp_path: Path):
    """With --max-train N, the mean and spread of the first N training molecules (the ones
    the loop trains on), not of the whole split."""
    task = ESOLTask(options("esol", write_esol(tmp_path), "--max-train", "5"))
    used = torch.stack([m.label for m in task.train_items()[:5]]).double()
    assert task.mean == pytest.approx(used.mean().item())
    assert task.std == pytest.approx(used.std().item())


def test_regression_metrics():
    got = regression_metrics(torch.tensor([0.0, 3.0]), torch.tensor([1.0, 1.0]))
    assert got == pytest.approx({"rmse": math.sqrt(2.5), "mae": 1.5})
    with pytest.raises(ValueError, match="one non-empty shape"):
        regression_metrics(torch.zeros(2), torch.zeros(3))


def test_esol_standardises_on_the_training_split(tmp_path: Path):
    task = ESOLTask(options("esol", write_esol(tmp_path)))
    train = torch.stack([m.label for m in task.train_items()]).double()
    assert task.mean == pytest.approx(train.mean().item())
    assert task.std == pytest.approx(train.std().item())
    dev = task.splits["dev"]
    truth = torch.stack([m.label for m in dev])
    perfect = (truth - task.mean) / task.std
    assert task.metrics(perfect, dev)["rmse"] == pytest.approx(0.0, abs=1e-6)
    loss, terms = task.batch_loss(perfect, dev)
    assert terms == len(dev) and loss.item() == pytest.approx(0.0, abs=1e-9)
    assert task.metrics(perfect + 1 / task.std, dev)["mae"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("task_class", "writer"), [(ESOLTask, write_esol), (Tox21Task, write_tox21)]
)
def test_front_ends_and_eager_give_the_same_loss(task_class, writer, tmp_path: Path):
    file = writer(tmp_path)
    name = task_class.name
    tasks: list[MoleculeTask] = [
        task_class(options(name, file, "--front-end", end)) for end in ("blocks", "lazy")
    ]
    torch.manual_seed(0)
    model = tasks[0].build_model()
    batch = tasks[0].train_items()[:9]
    want, terms = tasks[0].eager_loss(model, batch)
    for task in tasks:
        got, got_terms = task.loss(model, batch)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert got_terms == terms


def test_splits_random_and_scaffold(tmp_path: Path):
    file = write_esol(tmp_path)
    random_task = ESOLTask(options("esol", file))
    again = ESOLTask(options("esol", file))
    other = ESOLTask(options("esol", file, "--split-seed", "3"))
    scaffold = ESOLTask(options("esol", file, "--splitter", "scaffold"))
    sizes = [len(random_task.splits[s]) for s in ("train", "dev", "test")]
    assert sizes == [24, 3, 3]
    smiles = {name: [m.smiles for m in part] for name, part in random_task.splits.items()}
    assert smiles == {name: [m.smiles for m in part] for name, part in again.splits.items()}
    assert smiles["train"] != [m.smiles for m in other.splits["train"]]
    assert sum(len(part) for part in scaffold.splits.values()) == len(SMILES)


@pytest.mark.parametrize(
    ("task", "writer", "extra"),
    [
        ("esol", write_esol, ()),
        ("esol", write_esol, ("--splitter", "scaffold")),
        ("tox21", write_tox21, ("--front-end", "lazy", "--splitter", "scaffold")),
    ],
)
def test_a_tiny_run_through_the_command_line(task, writer, extra, tmp_path: Path):
    out = tmp_path / "run"
    argv = ["train", task, "--data", str(writer(tmp_path)), "--epochs", "2", "--batch-size", "8"]
    argv += ["--atom-dim", "6", "--pair-dim", "5", "--gather-dim", "4", "--hidden", "4"]
    argv += ["--threads", "1", "--out", str(out), "--compare-batches", "1", *extra]
    assert cli.main(argv) == 0
    assert {"config.json", "metrics.jsonl", "last.pt", "curves.png", "test.json"} <= {
        p.name for p in out.iterdir()
    }
    history = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((out / "test.json").read_text())
    metric = {"esol": "rmse", "tox21": "roc_auc"}[task]
    assert [r["epoch"] for r in history] == [1, 2] and metric in summary["test"]
    # esol on a random split keeps and tests the last epoch's weights; otherwise the best's
    keep = "last" if task == "esol" and "scaffold" not in extra else "best"
    assert json.loads((out / "config.json").read_text())["keep"] == keep
    pick = min if task == "esol" else max  # RMSE or ROC-AUC
    kept = 2 if keep == "last" else pick(history, key=lambda r: r["dev"][metric])["epoch"]
    assert summary["best_epoch"] == loop.load_checkpoint(out / "best.pt")["epoch"] == kept
    assert cli.main(["eval", task, "--checkpoint", str(out / "best.pt"), "--split", "dev"]) == 0


def test_dropout_is_saved_and_runs_saved_before_it_had_none(tmp_path: Path):
    out = tmp_path / "run"
    argv = ["train", "esol", "--data", str(write_esol(tmp_path)), "--epochs", "1"]
    argv += ["--atom-dim", "6", "--pair-dim", "5", "--gather-dim", "4", "--hidden", "4"]
    argv += ["--threads", "1", "--out", str(out), "--dropout", "0.5"]
    assert cli.main(argv) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["dropout"] == 0.5
    assert loop.load_checkpoint(out / "last.pt")["config"]["dropout"] == 0.5
    older = {k: v for k, v in config.items() if k != "dropout"}
    assert as_saved(older)["dropout"] == 0.0 and as_saved(config)["dropout"] == 0.5
    assert cli.main(["eval", "esol", "--checkpoint", str(out / "last.pt"), "--split", "dev"]) == 0


def test_atom_counts_widen_the_input_and_runs_saved_before_them_had_none(tmp_path: Path):
    out = tmp_path / "run"
    argv = ["train", "esol", "--data", str(write_esol(tmp_path)), "--epochs", "1"]
    argv += ["--atom-dim", "6", "--pair-dim", "5", "--gather-dim", "4", "--hidden", "4"]
    argv += ["--threads", "1", "--out", str(out), "--atom-counts"]
    assert cli.main(argv) == 0
    config = json.loads((out / "config.json").read_text())
    weights = loop.load_checkpoint(out / "last.pt")["model"]
    assert config["atom_counts"] is True
    assert weights["weave.0.atom_to_atom_layer.weight"].shape[1] == 38
    older = {k: v for k, v in config.items() if k != "atom_counts"}
    assert as_saved(older)["atom_counts"] is False
    assert cli.main(["eval", "esol", "--checkpoint", str(out / "last.pt"), "--split", "dev"]) == 0


def test_missing_data_says_where_to_get_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    argv = ["train", "tox21", "--data", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o")]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "tox21.csv or tox21.csv.gz not found" in err and "--data PATH" in err


@pytest.mark.parametrize("task", ["esol", "tox21"])
@pytest.mark.parametrize("command", ["train", "eval"])
def test_every_option_is_documented(task: str, command: str):
    parser = cli.build_parser(command, task)  # eval's --split must not clash with a task option
    undocumented = [
        action.option_strings
        for action in parser._actions  # the only way to list them
        if action.option_strings and not action.help
    ]
    assert undocumented == []
    if command == "train":
        args = parser.parse_args([])
        assert (args.optimizer, args.batch_size, args.front_end, args.splitter) == (
            "adam",
            32,
            "lazy",
            "random",
        )
