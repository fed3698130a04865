"""The peers of ``bench_weave.py``: their input files, their loss check and their timed runs.

Two peers run the Weave model in their own environments (``benchmarks/setup_peers.sh``):
DGL-LifeSci (``peers/dgllife_weave.py`` in ``benchmarks/.peers/dgl``) and PyTorch Geometric
(``peers/pyg_weave.py`` in ``benchmarks/.peers/pyg``), each with the molecules batched inside
the timed step and beforehand. Both read the molecules and batchfold's weights from the files
written here (:func:`write_molecules`, :func:`write_weights`; the formats are in
``dgllife_weave.py``'s docstring). :func:`check_peers` compares each peer's loss with the
one-at-a-time loop's; :func:`start_peers` keeps each peer's script running, to be asked for one
timed pass at a time (:class:`PeerPasses`); a peer that cannot run is a note, never a crash.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Collection, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from baselines import Timing, timing_fields
from batchfold.data.molecules import Molecule
from batchfold.models.weave import GAUSSIAN_MEMBERSHIPS, WeaveModel
from bench_lazy import turns
from peer_runner import PeerServer, PeerUnavailable, run_peer


class PeerSystem(NamedTuple):
    """A peer system: the peer's name, its environment, its script and the script's mode."""

    peer: str
    env: str
    script: str
    mode: str


PEERS = {
    "dgllife, batching in the step": PeerSystem("dgllife", "dgl", "dgllife_weave.py", "inloop"),
    "dgllife, graphs batched beforehand": PeerSystem(
        "dgllife", "dgl", "dgllife_weave.py", "prebuilt"
    ),
    "pyg, batching in the step": PeerSystem("pyg", "pyg", "pyg_weave.py", "inloop"),
    "pyg, graphs batched beforehand": PeerSystem("pyg", "pyg", "pyg_weave.py", "prebuilt"),
}
"""The peer systems by the name of their rows."""
PEAK_FIELDS = ("peak_mb", "resident_peak_mb", "peak_method", "peak_cuda_mb")
"""The fields of ``memory.PeakMemory.as_dict`` that a row keeps."""


def write_molecules(molecules: Sequence[Molecule], path: Path) -> Path:
    """Write molecules in the peers' format (``peers/dgllife_weave.py``); returns ``path``."""
    atoms = np.cumsum([0] + [m.n_atoms for m in molecules])
    pairs = np.cumsum([0] + [len(m.pair_index) for m in molecules])
    np.savez(
        path,
        atom_features=torch.cat([m.atom_features for m in molecules]).float().numpy(),
        atom_offsets=atoms.astype(np.int64),
        pair_features=torch.cat([m.pair_features for m in molecules]).float().numpy(),
        pair_index=torch.cat([m.pair_index for m in molecules]).long().numpy(),
        pair_offsets=pairs.astype(np.int64),
        target=torch.stack([m.label for m in molecules]).float().numpy(),
    )
    return path


def write_weights(model: WeaveModel, path: Path) -> Path:
    """Write the model's parameters and sizes in the peers' format; returns ``path``."""
    config = {
        "n_modules": len(model.layers),
        "atom_dim": model.layers[0].atom_out,
        "pair_dim": model.layers[0].pair_out,
        "gather": model.gather,
        "atom_features": model.atom_features,
        "pair_features": model.pair_features,
        "gaussian_memberships": GAUSSIAN_MEMBERSHIPS,  # the bins of the "gaussian" gather
    }
    arrays = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    np.savez(path, config=np.array(json.dumps(config)), **arrays)
    return path


def agreement(what: str, peer: str, got: float, expected: float) -> str:
    """Whether a peer's loss agrees with batchfold's loop (relative tolerance 1e-4)."""
    agree = math.isclose(got, expected, rel_tol=1e-4)
    return f"{what}: {peer} {got:.6g} vs the loop {expected:.6g}: " + (
        "they agree" if agree else "THEY DIFFER"
    )


def check_peers(
    molecules: Path, weights: Path, expected: tuple[float, float], n: int, lr: float
) -> tuple[list[str], set[str]]:
    """Each peer's loss on the molecules of a file, before and after one SGD step on them all.

    Arguments:
        molecules: the molecule file (:func:`write_molecules`).
        weights: the weights file (:func:`write_weights`).
        expected: the loop's losses (in float32, as the peers run) at those weights and after
            the same step.
        n: how many molecules the file holds (for the notes).
        lr: the step's learning rate.

    Returns:
        The notes (the verdicts, or why a peer cannot run) and the peers that ran.
    """
    notes: list[str] = []
    ran: set[str] = set()
    args = [str(molecules), "--weights", str(weights), "--loss-only", "--lr", str(lr)]
    for peer, env, script in dict.fromkeys((s.peer, s.env, s.script) for s in PEERS.values()):
        try:
            (line,) = run_peer(env, script, args)
        except PeerUnavailable as error:
            notes.append(f"{peer}: {error}")
            continue
        ran.add(peer)
        before, after = expected
        notes += [
            agreement(
                f"loss of {n} molecules at the shared initial weights", peer, line["loss"], before
            ),
            agreement(
                f"loss of the same {n} molecules after one SGD step (lr {lr}) on them",
                peer,
                line["loss_after_step"],
                after,
            ),
        ]
    return notes, ran


def pass_fields(timing: Timing, size: int) -> dict[str, Any]:
    """A row's fields for the timed passes: throughput, median, spread and every pass."""
    fields = timing_fields(timing)
    return {
        "molecules_per_s": fields.pop("trees_per_s"),
        **fields,
        "molecules_per_pass": timing.batch_size,
        "steps_per_pass": timing.batch_size // size,
    }


class PeerPasses:
    """One peer system's passes, each asked of its peer's running script (``--serve``).

    Arguments:
        server: the peer's script, loaded once.
        mode: the script's mode (``"prebuilt"`` or ``"inloop"``).
    """

    def __init__(self, server: PeerServer, mode: str) -> None:
        self.server, self.mode = server, mode

    def __call__(self, size: int, training: bool) -> tuple[float, dict[str, Any]]:
        """Seconds of one pass over the molecules in batches of ``size``, and its answer."""
        answer = self.server.ask({"mode": self.mode, "batch_size": size, "training": training})
        return answer["seconds"], answer


def start_peers(
    files: tuple[Path, Path],
    threads: int,
    lr: float,
    peers: Collection[str],
    stack: ExitStack,
) -> tuple[dict[str, PeerPasses], list[str]]:
    """A running script per peer of ``peers``, each serving both of its systems' passes.

    Arguments:
        files: the molecule and weights files.
        threads: the peers' torch threads.
        lr: the SGD learning rate of the training passes.
        peers: the peers to start (``"dgllife"``, ``"pyg"``).
        stack: closes the scripts when the caller is done.

    Returns:
        The passes of every system by the name of its row, and a note for each peer that
        cannot start.
    """
    args = [str(files[0]), "--weights", str(files[1]), "--threads", str(threads), "--lr", str(lr)]
    servers: dict[str, PeerServer] = {}
    systems: dict[str, PeerPasses] = {}
    notes: list[str] = []
    failed: set[str] = set()
    for system, (peer, env, script, mode) in PEERS.items():
        if peer not in peers or peer in failed:
            continue
        if peer not in servers:
            try:
                servers[peer] = stack.enter_context(PeerServer(env, script, args))
            except PeerUnavailable as error:
                notes.append(f"{peer}: {error}")
                failed.add(peer)
                continue
        systems[system] = PeerPasses(servers[peer], mode)
    return systems, notes


def measure_in_turns(
    systems: dict[str, Callable[[], tuple[float, dict[str, Any]]]],
    repeats: int,
    molecules: int,
    size: int,
    notes: list[str],
) -> dict[str, dict[str, Any]]:
    """Every system's passes, taking turns, and each system's row fields.

    One warm-up round, then ``repeats`` timed rounds; each system runs one pass a round, in
    an order that rotates from round to round (the peers' scripts stay loaded and wait for
    their turn), so that a slow minute of a shared machine weighs on every system alike.

    Arguments:
        systems: one pass of each system, by name: its seconds and its answer (the peak
            memory fields, and for a peer the ``molecules`` it ran).
        repeats: the timed rounds.
        molecules: the molecules of one pass.
        size: the batch size.
        notes: takes a note for each peer that stops or runs another number of molecules;
            such a peer has no row.

    Returns:
        Each remaining system's throughput and spread over its timed passes, and the peak
        memory fields of its pass with the highest peak.
    """
    times: dict[str, list[float]] = {name: [] for name in systems}
    peaks: dict[str, list[dict[str, Any]]] = {name: [] for name in systems}
    for i, name in turns(list(systems), repeats):
        if name not in times:
            continue
        try:
            seconds, answer = systems[name]()
            if answer.get("molecules", molecules) != molecules:
                raise PeerUnavailable(f"ran {answer['molecules']} molecules, not {molecules}")
        except PeerUnavailable as error:
            notes.append(f"{name}, b={size}: {error}")
            del times[name]
            continue
        peaks[name].append(answer)
        if i:
            times[name].append(seconds)
    fields = {}
    for name, timed in times.items():
        peak = max(peaks[name], key=lambda answer: answer["peak_mb"])
        fields[name] = pass_fields(Timing(timed, molecules), size) | {
            key: peak[key] for key in PEAK_FIELDS if key in peak
        }
    return fields
