"""Running the peer systems' benchmark scripts from the main benchmarks, in their own environments.

Each peer (DyNet, DGL, PyTorch Geometric) has a virtual environment under
``benchmarks/.peers/<peer>``, made by ``benchmarks/setup_peers.sh``, and scripts under
``benchmarks/peers/`` that print one JSON line per configuration. A benchmark writes the trees
(:func:`write_trees`; ``weave_peers.py`` writes molecules) and the initial weights it uses to
files, runs the peer script on them (:func:`run_peer`) and folds the JSON lines into its own
results; or it keeps a peer script running and asks it for one timed pass at a time
(:class:`PeerServer`), so that the peer takes turns with the other systems. A peer that is not
installed, or whose run fails, is reported with the reason (:class:`PeerUnavailable`) and the
benchmark carries on.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from batchfold.data.trees import BinaryTree

HERE = Path(__file__).resolve().parent
PEER_ENVS = HERE / ".peers"
PEER_SCRIPTS = HERE / "peers"
_PROBES = {
    "dynet": "import dynet_config",
    "dgl": "import dgl, torch",
    "pyg": "import torch_geometric, torch",
}


class PeerUnavailable(RuntimeError):
    """A peer system cannot run here; the message says why."""


def peer_python(peer: str) -> Path:
    """The Python of a peer's environment, checked (once per process) to import the peer.

    Arguments:
        peer: ``"dynet"``, ``"dgl"`` or ``"pyg"``.

    Returns:
        The interpreter's path.

    Raises:
        PeerUnavailable: the environment is missing or cannot import the peer.
    """
    found = _probe(peer)
    if isinstance(found, str):
        raise PeerUnavailable(found)
    return found


@functools.cache
def _probe(peer: str) -> Path | str:
    """The peer's interpreter, or why there is none."""
    python = PEER_ENVS / peer / "bin" / "python"
    if not python.exists():
        return (
            f"peer not installed: no {python.relative_to(HERE.parent)} "
            "(run bash benchmarks/setup_peers.sh)"
        )
    probe = subprocess.run(
        [str(python), "-c", _PROBES[peer]],
        capture_output=True,
        text=True,
        env={**os.environ, "DGLBACKEND": "pytorch"},
    )
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["unknown error"])[-1]
        return f"peer not installed: {peer} does not import ({last})"
    return python


def run_peer(peer: str, script: str, args: Sequence[str], timeout: float = 3600) -> list[dict]:
    """Run one peer script and return the JSON objects it printed, one per line.

    Arguments:
        peer: the environment to run in (``"dynet"``, ``"dgl"``, ``"pyg"``).
        script: the file name under ``benchmarks/peers/``.
        args: its command-line arguments.
        timeout: seconds before the run is abandoned.

    Returns:
        The parsed lines.

    Raises:
        PeerUnavailable: the peer is not installed, or the run failed or timed out.
    """
    python = peer_python(peer)
    command = [str(python), str(PEER_SCRIPTS / script), *args]
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "DGLBACKEND": "pytorch"},
        )
    except subprocess.TimeoutExpired as error:
        raise PeerUnavailable(f"{peer} {script} ran past {timeout:.0f} s") from error
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise PeerUnavailable(f"{peer} {script} failed: {last}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


class PeerServer:
    """A peer script kept running with ``--serve``: one JSON command in, one JSON line out.

    Arguments:
        peer: the environment to run in (``"dgl"``, ``"pyg"``).
        script: the file name under ``benchmarks/peers/``.
        args: its command-line arguments (``--serve`` is added).
        timeout: seconds to wait for the script to load, and for each answer.

    Raises:
        PeerUnavailable: the peer is not installed, or the script stops or says nothing
            within ``timeout``.
    """

    def __init__(self, peer: str, script: str, args: Sequence[str], timeout: float = 600) -> None:
        python = peer_python(peer)
        self.name = f"{peer} {script}"
        self.timeout = timeout
        # a file, not a pipe, which could fill and stall the script; closed in close()
        self._errors = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
        self._process = subprocess.Popen(
            [str(python), str(PEER_SCRIPTS / script), *args, "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._errors,
            text=True,
            env={**os.environ, "DGLBACKEND": "pytorch"},
        )
        self._timed_out = False
        try:
            self.ready = self._answer()
        except BaseException:
            self.close()
            raise

    def ask(self, command: dict[str, Any]) -> dict[str, Any]:
        """Send one command and return the script's answer."""
        stdin = self._process.stdin
        assert stdin is not None
        if self._process.poll() is not None:
            raise self._failed()
        try:
            stdin.write(json.dumps(command) + "\n")
            stdin.flush()
        except BrokenPipeError as error:
            raise self._failed() from error
        return self._answer()

    def close(self) -> None:
        """End the script (it stops when its input closes) and free its files."""
        stdin = self._process.stdin
        if stdin is not None and not stdin.closed:
            with contextlib.suppress(BrokenPipeError):  # a stopped script left a command unread
                stdin.close()
        try:
            self._process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()
        self._errors.close()

    def __enter__(self) -> PeerServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _answer(self) -> dict[str, Any]:
        stdout = self._process.stdout
        assert stdout is not None
        deadline = threading.Timer(self.timeout, self._time_out)
        deadline.start()
        try:
            for line in stdout:  # the peer library may print lines of its own, even "{..."
                if line.startswith("{"):
                    with contextlib.suppress(ValueError):
                        return json.loads(line)
        finally:
            deadline.cancel()
        raise self._failed()

    def _time_out(self) -> None:
        self._timed_out = True
        self._process.kill()

    def _failed(self) -> PeerUnavailable:
        self._process.wait()
        if self._timed_out:
            return PeerUnavailable(f"{self.name} said nothing within {self.timeout:.0f} s")
        self._errors.seek(0)
        last = (self._errors.read().strip().splitlines() or ["no message"])[-1]
        return PeerUnavailable(
            f"{self.name} stopped (exit status {self._process.returncode}): {last}"
        )


def loss_agreement(peer_loss: float, expected: float, n_trees: int) -> str:
    """How a peer's loss at the shared initial weights compares with batchfold's naive run."""
    agree = math.isclose(peer_loss, expected, rel_tol=1e-4)
    return (
        f"loss of {n_trees} trees at the shared initial weights {peer_loss:.6g} vs batchfold's "
        f"naive run {expected:.6g}: " + ("they agree" if agree else "THEY DIFFER")
    )


def nested(tree: BinaryTree) -> tuple[Any, Any]:
    """A tree as ``treeio``'s nested lists: ``(structure, labels)`` (see ``peers/treeio.py``).

    Example:
        >>> leaf = BinaryTree.leaf
        >>> nested(BinaryTree.node(leaf(3, 1), leaf(5, 2), label=4))
        ([3, 5], [4, 1, 2])
    """
    stack: list[tuple[Any, Any]] = []
    for node in tree.nodes():  # post-order, iterative
        if node.left is None:
            stack.append((node.word, node.label))
        else:
            right, left = stack.pop(), stack.pop()
            stack.append(([left[0], right[0]], [node.label, left[1], right[1]]))
    return stack[0]


def write_trees(trees: Sequence[BinaryTree], path: Path) -> Path:
    """Write trees (words and every node's label) in ``treeio``'s JSON format.

    Arguments:
        trees: the trees, in the order the peer should batch them.
        path: the file to write.

    Returns:
        ``path``.
    """
    pairs = [nested(t) for t in trees]
    data = {"trees": [p[0] for p in pairs], "labels": [p[1] for p in pairs]}
    path.write_text(json.dumps(data, separators=(",", ":")))
    return path
