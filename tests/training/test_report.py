"""The HTML report of a run: written by train and by ``batchfold report``, self-contained,
and rendered by a real browser (headless Chromium) without console errors."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from sst_files import make_tiny_sst

import batchfold
from batchfold import cli
from batchfold.blocks.compiler import CompiledModel
from batchfold.profile import Profile
from batchfold.training.report import write_report

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


@pytest.fixture(scope="module", params=["lazy", "blocks"])
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny finished SST run of each front end (trained once per module)."""
    root = tmp_path_factory.mktemp(f"report-{request.param}")
    tiny = make_tiny_sst(root)
    out = root / "run"
    assert cli.main(tiny.train_argv(out, "--front-end", request.param)) == 0
    return out


def assert_self_contained(html: str) -> None:
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", html, re.IGNORECASE)
    assert "<script" not in html.lower()
    assert "<link" not in html.lower()


def test_train_writes_profile_and_report(run: Path) -> None:
    config = json.loads((run / "config.json").read_text())
    profile = json.loads((run / "profile.json").read_text())
    assert profile["front_end"] == ("blocks" if config["front_end"] == "blocks" else "batch_map")
    assert profile["items"] == config["batch_size"] and profile["calls"] == 1
    assert sum(s["batch"] for s in profile["steps"]) == profile["nodes"] > 0
    assert sum(r["steps"] for r in profile["profile"]) == len(profile["steps"])
    assert sum(r["nodes"] for r in profile["profile"]) == profile["nodes"]
    assert set(profile["phases"]) == {"record", "schedule", "execute", "backward"}
    assert profile["phases"]["backward"] > 0  # the backward pass ran and was timed
    html = (run / "report.html").read_text()
    assert_self_contained(html)
    assert html.count("<svg") >= 4  # curves, speed, plan, histogram
    assert "the plan: steps in the order they ran" in html
    assert "<h3>The profiler's table</h3><table>" in html
    for row in profile["profile"]:
        assert f"<td>{row['signature']}</td>" in html
    for key, value in config.items():  # every option, with its value
        assert f"<td>{key}</td><td>{json.dumps(value).replace(chr(34), '&quot;')}</td>" in html
    # capture() restored everything it patched
    assert batchfold.batch_map.__module__ == "batchfold.lazy.api"
    assert CompiledModel.run.__qualname__ == "CompiledModel.run"
    assert Profile.step.__qualname__ == "Profile.step"


def test_report_of_an_old_run_shows_what_exists(run: Path, tmp_path: Path) -> None:
    for name in ("config.json", "metrics.jsonl", "test.json"):
        shutil.copy(run / name, tmp_path / name)
    path = write_report(tmp_path)
    html = path.read_text()
    assert path == tmp_path / "report.html"
    assert "has no profile.json" in html and "Learning curves" in html
    assert_self_contained(html)


def test_report_command(run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.html"
    assert cli.main(["report", str(run), "--out", str(out)]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert capsys.readouterr().out.strip() == str(out)


@pytest.mark.parametrize("missing", ["folder", "config"])
def test_report_command_errors_in_one_line(
    missing: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "nothing" if missing == "folder" else tmp_path
    assert cli.main(["report", str(folder)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("batchfold report: error: ")
    assert ("no such run folder" if missing == "folder" else "no config.json") in err


@pytest.mark.parametrize("name", ["config.json", "metrics.jsonl"])
def test_a_file_that_is_not_json_is_named(
    run: Path, tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "cut"
    shutil.copytree(run, folder)
    (folder / name).write_text((folder / name).read_text()[:-9])  # cut short in the last line
    assert cli.main(["report", str(folder)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{folder / name}:" in err and "not JSON" in err


def test_report_survives_a_task_without_batched_calls(tmp_path: Path) -> None:
    from test_train_loop import LinearTask, linear_args

    from batchfold.training import loop

    loop.train(LinearTask(), linear_args(tmp_path, "--epochs", "1"))
    assert json.loads((tmp_path / "profile.json").read_text())["steps"] == []
    assert "made no batched call" in (tmp_path / "report.html").read_text()


def _browser() -> str | None:
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


def test_report_renders_in_chromium(run: Path) -> None:
    browser = _browser()
    if browser is None:
        pytest.skip("no Chromium: apt-get install chromium (see the README)")
    shot = run / "report.png"
    command = [
        browser,
        *("--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars"),
        *("--enable-logging=stderr", "--v=0", "--window-size=1200,1600"),
        f"--screenshot={shot}",
        (run / "report.html").resolve().as_uri(),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    # Chromium logs every console message and page error as "...:INFO:CONSOLE:1] ..."
    # (older versions "CONSOLE(1)"); an uncaught exception reads "Uncaught ...".
    console = [
        line
        for line in done.stderr.splitlines()
        if ":CONSOLE" in line or "CONSOLE(" in line or "Uncaught" in line
    ]
    assert console == []
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
