"""What the DyNet peer scripts share: starting DyNet in one autobatch mode, one process per mode.

Needs the standard library and ``treeio`` only (DyNet itself is imported when started), so it
runs in DyNet's environment (``benchmarks/.peers/dynet``).
"""

from __future__ import annotations

import os
import subprocess
import sys
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
