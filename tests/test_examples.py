"""The batch_map examples in examples/ run as ``python examples/NAME.py`` and print what they promise.

Each runs in this process with its default sizes, a few seconds on one thread; the examples
check their own results (batched equals one at a time) and raise if those differ.
"""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).parents[1] / "examples"


def run_example(name: str, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """Run ``examples/<name>.py`` as a script on one thread; the lines it printed."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        runpy.run_path(str(EXAMPLES / f"{name}.py"), run_name="__main__")
    finally:
        torch.set_num_threads(threads)
    return capsys.readouterr().out.splitlines()


def test_tree_lstm_batch_map_trains_and_matches_one_tree_at_a_time(
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines = run_example("tree_lstm_batch_map", capsys)
    losses = [float(line.split("loss ")[1]) for line in lines if ": loss " in line]
    assert len(losses) == 5 and losses[-1] < 0.1 < losses[0]
    difference = next(line for line in lines if "max difference" in line)
    assert float(difference.rsplit(" ", 1)[1]) < 1e-5
    assert any(line.startswith("3 instances, ") for line in lines)  # print(stats)
    assert any(line.startswith("Plan: ") for line in lines)  # print(stats.plan)


def test_greedy_decoder_batched_equals_one_at_a_time(capsys: pytest.CaptureFixture[str]) -> None:
    lines = run_example("greedy_decoder", capsys)  # it asserts the equality itself
    assert lines[0].startswith("trained to count down") and "7 -> [6, 5, 4, 3, 2, 1, 0]" in lines[0]
    assert lines[1] == "64 sequences of 1 to 11 tokens, decoded in 11 syncs"
    assert lines[2] == "batched decoding = one at a time: same tokens, scores and gradients"
    assert lines[3].startswith("64 instances")  # print(stats)
