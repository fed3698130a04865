"""What the DyNet peer scripts share: starting DyNet in one autobatch mode, one process per mode.

Needs the standard library and ``treeio`` only (DyNet itself is imported when started), so it
runs in DyNet's environment (``benchmarks/.peers/dynet``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import treeio

MODE_NAMES = {0: "none", 1: "agenda", 2: "depth"}


def start_dynet(mem: str, mode: int):
    """Import DyNet with its memory pools and autobatch mode set; returns it and its version.

    Arguments:
        mem: ``--dynet-mem`` in MB (one size, or the comma-separated pools).
        mode: 0 none, 1 agenda, 2 depth.
    """
    import dynet_config  # pyright: ignore[reportMissingImports]  (the peer environment only)

    dynet_config.set(mem=str(mem), autobatch=mode, random_seed=1)
    import dynet as dy  # pyright: ignore[reportMissingImports]

    try:
        from importlib.metadata import version

        dy_version = version("dyNET38")
    except Exception:
        dy_version = "unknown"
    return dy, dy_version


def run_each_mode(script: str, argv: list[str], modes: str, run_mode: Callable[[int], None]) -> int:
    """Run ``run_mode`` for one mode here, or ``script`` once per mode in a child process.

    DyNet reads its configuration once per process, hence one child per mode.

    Arguments:
        script: the peer script's path (``__file__``).
        argv: its command-line arguments; each child gets them with ``--autobatch MODE``.
        modes: the ``--autobatch`` value, e.g. ``"0,1,2"``.
        run_mode: runs the script's work in one mode, in this process.

    Returns:
        The exit status: 0, or the first failing child's.
    """
    parsed = treeio.parse_int_list(modes)
    for m in parsed:
        if m not in MODE_NAMES:
            raise SystemExit(f"unknown autobatch mode {m} (0 none, 1 agenda, 2 depth)")
    if len(parsed) == 1:
        run_mode(parsed[0])
        return 0
    rc = 0
    for m in parsed:
        r = subprocess.run([sys.executable, os.path.abspath(script), *argv, "--autobatch", str(m)])
        rc = rc or r.returncode
    return rc


def sentence_main(script: str, doc: str | None, make_model: Callable, argv=None) -> int:
    """The command line of a sentence-batch training peer (``dynet_tagger.py``, ...).

    Reads ``SENTENCES.json`` (``{"batches": [[sentence, ...], ...], ...}``: a warm-up batch,
    then the timed ones), builds ``make_model(dy, data)`` (an object with ``train_step(batch)``)
    and prints one JSON line per autobatch mode: the time of every timed step and the median.
    ``doc`` is the script's docstring; its first line describes the command.
    """
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("sentences", help="sentence file (JSON, see the script's docstring)")
    parser.add_argument("--autobatch", default="0,1,2", help="modes: 0 none, 1 agenda, 2 depth")
    parser.add_argument("--mem", default="4096", help="DyNet memory pool in MB (--dynet-mem)")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)  # a child gets argv plus its own --autobatch, which wins

    def run_mode(mode: int) -> None:
        dy, version = start_dynet(args.mem, mode)
        with open(args.sentences) as f:
            data = json.load(f)
        model = make_model(dy, data)
        warmup, *timed = data["batches"]
        model.train_step(warmup)
        times = []
        for batch in timed:
            start = time.perf_counter()
            model.train_step(batch)
            times.append(time.perf_counter() - start)
        line = {
            "system": "dynet",
            "version": version,
            "mode": MODE_NAMES[mode],
            "autobatch": mode,
            "batch_size": len(warmup),
            "times_s": times,
            "median_s": statistics.median(times),
        }
        print(json.dumps(line), flush=True)

    return run_each_mode(script, argv, args.autobatch, run_mode)


class SentenceTrainer:
    """A training step on a batch of sentences, for models that define ``sentence_losses``.

    The step builds one graph of every sentence's losses, sums them, runs forward, backward
    and one plain SGD update (no gradient clipping), as the PyTorch systems do.
    """

    def __init__(self, dy, pc) -> None:
        self.dy, self.pc = dy, pc
        self.trainer = dy.SimpleSGDTrainer(pc, learning_rate=1e-4)
        self.trainer.set_clip_threshold(0.0)

    def sentence_losses(self, sentence: dict, out: list) -> None:
        raise NotImplementedError

    def train_step(self, batch: list[dict]) -> float:
        self.dy.renew_cg()
        losses: list = []
        for sentence in batch:
            self.sentence_losses(sentence, losses)
        loss = self.dy.esum(losses)
        value = loss.value()
        loss.backward()
        self.trainer.update()
        return value
