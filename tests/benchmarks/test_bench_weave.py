"""The systems of benchmarks/bench_weave.py agree with the one-at-a-time loop, and its files.

benchmarks/ is not a package and is never collected; this test puts it on ``sys.path`` to
import the benchmark, as the benchmark scripts do when run from there.
"""

from __future__ import annotations

import io
import json
import sys
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_weave  # noqa: E402
from batchfold.data.molecules import featurize  # noqa: E402
from batchfold.models.weave import GAUSSIAN_MEMBERSHIPS, WeaveModel  # noqa: E402

SMILES = ("CCO", "c1ccccc1O", "CC(=O)N")


def _molecules():
    return [featurize(s, label=[0.5 * k - 0.3]) for k, s in enumerate(SMILES)]


def _model() -> WeaveModel:
    torch.manual_seed(0)
    return WeaveModel(atom_dim=6, pair_dim=5, gather_dim=4, hidden=3).double()


def test_systems_agree_with_the_loop():
    bench_weave.check_systems(_model(), _molecules())


def test_check_catches_a_wrong_system(monkeypatch):
    def skewed(model, batch):
        return bench_weave.squared_error(
            torch.stack([bench_weave.weave_predict(model, m) for m in batch]) * 1.001, batch
        )

    real = bench_weave.make_systems

    def systems(model):
        out = real(model)
        out["batchfold blocks"] = lambda batch: skewed(model, batch)
        return out

    monkeypatch.setattr(bench_weave, "make_systems", systems)
    with pytest.raises(RuntimeError, match="batchfold blocks"):
        bench_weave.check_systems(_model(), _molecules())


def test_peer_files(tmp_path):
    molecules = _molecules()
    data = np.load(bench_weave.write_molecules(molecules, tmp_path / "m.npz"))
    atoms, pairs = data["atom_offsets"], data["pair_offsets"]
    assert atoms.tolist() == [0, 3, 10, 14]
    for k, m in enumerate(molecules):
        index = data["pair_index"][pairs[k] : pairs[k + 1]]
        assert index.tolist() == m.pair_index.tolist()
        assert np.array_equal(data["atom_features"][atoms[k] : atoms[k + 1]], m.atom_features)
    assert data["target"][:, 0].tolist() == pytest.approx([-0.3, 0.2, 0.7])
    model = _model()
    stored = np.load(bench_weave.write_weights(model, tmp_path / "w.npz"))
    config = json.loads(str(stored["config"]))
    assert config == {
        "n_modules": 2,
        "atom_dim": 6,
        "pair_dim": 5,
        "gather": "sum",
        "atom_features": 27,
        "pair_features": 12,
        "gaussian_memberships": [list(bin) for bin in GAUSSIAN_MEMBERSHIPS],
    }
    assert set(stored.files) == {"config", *model.state_dict()}
    assert stored["weave.0.atom_to_pair_layer.weight"].dtype == np.float32


def test_systems_take_turns_and_a_stopped_peer_is_a_note():
    from peer_runner import PeerUnavailable
    from weave_peers import measure_in_turns

    calls: list[str] = []
    peaks = iter([3.0, 9.0, 1.0, 2.0, 7.0, 4.0, 5.0, 6.0, 8.0])

    def system(name: str, fail_on: int | None = None, molecules: int = 8):
        def one_pass():
            calls.append(name)
            if fail_on is not None and calls.count(name) == fail_on:
                raise PeerUnavailable("it stopped")
            seconds = 5.0 if calls.count(name) == 1 else 0.25 * calls.count(name)  # warm-up: 5
            answer = {"peak_mb": next(peaks), "resident_peak_mb": None, "peak_method": "x"}
            return seconds, answer | {"molecules": molecules}

        return one_pass

    notes: list[str] = []
    systems = {
        "a": system("a"),
        "b": system("b"),
        "peer": system("peer", fail_on=2),
        "short": system("short", molecules=4),
    }
    rows = measure_in_turns(systems, repeats=2, molecules=8, size=4, notes=notes)
    # a warm-up round and two timed rounds, each in an order rotated by one
    assert calls == ["a", "b", "peer", "short", "b", "peer", "a", "a", "b"]
    assert set(rows) == {"a", "b"}
    assert notes == ["short, b=4: ran 4 molecules, not 8", "peer, b=4: it stopped"]
    assert rows["a"]["times_s"] == [0.5, 0.75]  # not the warm-up pass
    assert rows["a"]["median_s"] == 0.625 and rows["a"]["molecules_per_s"] == 8 / 0.625
    assert rows["a"]["peak_mb"] == 5.0  # its passes peaked at 3, 4, 5
    assert rows["b"]["peak_mb"] == 9.0  # at 9, 7, 6: the highest, not the last


def test_a_served_peer_times_one_pass_per_command(monkeypatch, capsys):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "peers"))
    import weave_io  # pyright: ignore[reportMissingImports]  (benchmarks/peers, put on the path above)

    steps: list[tuple[str, object]] = []

    def batches(mode, spans):
        return [list(s) for s in spans], lambda item: (mode, tuple(item))

    commands = [
        {"mode": "inloop", "batch_size": 2, "training": True},
        {"mode": "prebuilt", "batch_size": 3, "training": False},
    ]
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(json.dumps(c) + "\n" for c in commands)))
    weave_io.serve(
        "fake",
        "v1",
        1,
        6,
        batches,
        lambda item: steps.append(("train", item)),
        lambda item: steps.append(("infer", item)),
    )
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines[0] == {"ready": True, "system": "fake", "version": "v1", "threads": 1}
    # the peer scripts reach it through time_modes with --serve
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    args = weave_io.parse_args(None, ["m.npz", "--weights", "w.npz", "--serve", "--threads", "2"])
    weave_io.time_modes(args, "fake", "v2", 6, batches, print, print)
    assert json.loads(capsys.readouterr().out)["threads"] == 2
    assert [line["molecules"] for line in lines[1:]] == [6, 6]
    assert all(line["seconds"] >= 0 and "peak_mb" in line for line in lines[1:])
    assert steps == [
        ("train", ("inloop", (0, 1))),
        ("train", ("inloop", (2, 3))),
        ("train", ("inloop", (4, 5))),
        ("infer", ("prebuilt", (0, 1, 2))),
        ("infer", ("prebuilt", (3, 4, 5))),
    ]


ECHO_PEER = """
import json, sys, time
print("a line of the library's own")
print("{a line of the library's own}")
print(json.dumps({"ready": True, "version": "echo 1"}), flush=True)
for line in sys.stdin:
    command = json.loads(line)
    if command["batch_size"] < 0:
        time.sleep(60)
    if command["batch_size"] == 0:
        print("the script failed", file=sys.stderr)
        sys.exit(3)
    print(json.dumps({"seconds": 0.25, "asked": command}), flush=True)
"""


def test_a_peer_server_answers_each_command_and_reports_a_stop(tmp_path, monkeypatch):
    import peer_runner

    (tmp_path / "echo_peer.py").write_text(ECHO_PEER)
    monkeypatch.setattr(peer_runner, "PEER_SCRIPTS", tmp_path)
    monkeypatch.setattr(peer_runner, "peer_python", lambda peer: Path(sys.executable))
    with peer_runner.PeerServer("echo", "echo_peer.py", ["--x"], timeout=60) as server:
        assert server.ready == {"ready": True, "version": "echo 1"}
        command = {"mode": "inloop", "batch_size": 4, "training": True}
        assert server.ask(command) == {"seconds": 0.25, "asked": command}
        for _ in range(2):  # and again once it has stopped; closing it then is no error
            with pytest.raises(peer_runner.PeerUnavailable, match="status 3.*the script failed"):
                server.ask({**command, "batch_size": 0})
    slow = peer_runner.PeerServer("echo", "echo_peer.py", [], timeout=1)
    with slow, pytest.raises(peer_runner.PeerUnavailable, match="said nothing within 1 s"):
        slow.ask({"mode": "inloop", "batch_size": -1, "training": False})


def test_a_peer_that_cannot_start_is_one_note(monkeypatch):
    import weave_peers

    missing = weave_peers.PeerSystem("nopeer", "no-such-env", "nothing.py", "inloop")
    monkeypatch.setattr(
        weave_peers, "PEERS", {"nopeer, in the step": missing, "nopeer, beforehand": missing}
    )
    with ExitStack() as stack:
        systems, notes = weave_peers.start_peers(
            (Path("m.npz"), Path("w.npz")), 1, 1e-6, {"nopeer"}, stack
        )
    assert systems == {}
    assert len(notes) == 1 and notes[0].startswith("nopeer: peer not installed")
