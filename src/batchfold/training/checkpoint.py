"""Checkpoint files: written atomically with a SHA-256 checksum, verified when read.

A checkpoint (``last.pt``, ``best.pt``) is one header line followed by the bytes of
``torch.save(payload)``::

    batchfold-checkpoint 1 sha256=<64 hex digits> length=<payload bytes>\\n
    <payload>

:func:`write_checkpoint` writes it to a temporary file in the same folder, flushes and
fsyncs it, renames it over the old file with :func:`os.replace` and fsyncs the folder: a
crash at any point leaves either the old file or the new one, never a mix.
:func:`load_checkpoint` checks the header, the length and the checksum before handing the
payload to ``torch.load``, so an empty, truncated or damaged file is a
:class:`~batchfold.errors.CheckpointError` that names the file and what to do, never
silently wrong weights.

Files written by older versions of batchfold (plain ``torch.save`` files, with no header)
are still loaded, with a warning that they cannot be checked.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from batchfold.errors import CheckpointError

__all__ = [
    "DEFAULT_ADVICE",
    "FORMAT_VERSION",
    "encode_checkpoint",
    "load_checkpoint",
    "rng_state",
    "save_checkpoint",
    "set_rng_state",
    "write_checkpoint",
]

FORMAT_VERSION = 1
"""The version written in the header of new checkpoints."""

DEFAULT_ADVICE = (
    "use another checkpoint of the run (best.pt or last.pt in the same folder) or train again"
)
"""What a :class:`~batchfold.errors.CheckpointError` suggests when the caller gives no advice."""

_MAGIC = b"batchfold-checkpoint"
_HEADER = re.compile(rb"batchfold-checkpoint (\d+) sha256=([0-9a-f]{64}) length=(\d+)\n")
_LONGEST_HEADER = 200  # bytes; the header line is about 110
_TORCH_STARTS = (b"PK\x03\x04", b"\x80")  # torch.save's zip format, and its legacy pickle one
_TRAINING_KEYS = frozenset({"model", "config", "epoch"})


def encode_checkpoint(payload: dict[str, Any]) -> bytes:
    """The bytes of a checkpoint file: the checksummed header and ``torch.save(payload)``.

    Arguments:
        payload: what to save; tensors, numbers, strings, lists and dicts.

    Returns:
        The file's bytes, for :func:`write_checkpoint`.

    Example:
        >>> data = encode_checkpoint({"epoch": 1})
        >>> data.split(b" ")[:2]
        [b'batchfold-checkpoint', b'1']
    """
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    body = buffer.getvalue()
    digest = hashlib.sha256(body).hexdigest()
    header = f"{_MAGIC.decode()} {FORMAT_VERSION} sha256={digest} length={len(body)}\n"
    return header.encode("ascii") + body


def write_checkpoint(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace the file at ``path`` by ``data`` atomically and durably.

    The bytes go to ``<path>.tmp-<pid>`` in the same folder, which is flushed, fsynced and
    renamed over ``path``; the folder is then fsynced so that the rename survives a power
    cut. If anything fails before the rename, ``path`` keeps its old contents and the
    temporary file is removed.

    Arguments:
        path: the checkpoint file.
        data: its bytes, from :func:`encode_checkpoint`.
    """
    file = Path(path)
    tmp = file.with_name(f"{file.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, file)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_folder(file.parent)


def save_checkpoint(path: str | os.PathLike[str], payload: dict[str, Any]) -> None:
    """Encode ``payload`` and write it to ``path`` atomically (see :func:`write_checkpoint`).

    Arguments:
        path: the checkpoint file.
        payload: what to save.
    """
    write_checkpoint(path, encode_checkpoint(payload))


def _fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (best effort: not every system can sync a folder)."""
    if os.name == "nt":  # Windows cannot open a folder as a file; its renames are journaled
        return
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse to fsync a folder; the rename has happened
        pass
    finally:
        os.close(fd)


def load_checkpoint(
    path: str | os.PathLike[str], device: str = "cpu", *, advice: str = DEFAULT_ADVICE
) -> dict[str, Any]:
    """Read and verify a checkpoint written by training (``last.pt`` or ``best.pt``).

    Arguments:
        path: the file.
        device: where the tensors go.
        advice: what the error message tells the user to do when the file is damaged.

    Returns:
        A dict with ``model``, ``optimizer``, ``epoch``, ``rng``, ``config``, ``best`` and
        ``dev`` (the epoch's dev metrics).

    Raises:
        FileNotFoundError: no such file.
        CheckpointError: the file is empty, truncated, damaged (its checksum does not match)
            or not a batchfold training checkpoint; the message names the file.
    """
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"no checkpoint at {file}")
    data = file.read_bytes()
    if data.startswith(_MAGIC):
        body = _verified_body(file, data, advice)
    elif data.startswith(_TORCH_STARTS):
        warnings.warn(
            f"checkpoint {file} has no checksum (it was written by an older batchfold), so "
            "damage to it cannot be detected; loading it unchecked. Training writes checked "
            "checkpoints from its next epoch on.",
            stacklevel=2,
        )
        body = data
    elif not data:
        raise _error(file, "is empty (0 bytes): it was never completely written", advice)
    else:
        raise _error(file, "is not a batchfold checkpoint, or its first bytes are damaged", advice)
    try:
        payload = torch.load(io.BytesIO(body), map_location=device, weights_only=True)
    except Exception as err:  # torch.load raises many kinds (RuntimeError, UnpicklingError, ...)
        reason = (str(err).strip().splitlines() or [""])[0]
        raise _error(
            file, f"cannot be read by torch.load ({type(err).__name__}: {reason})", advice
        ) from err
    if not isinstance(payload, dict) or not payload.keys() >= _TRAINING_KEYS:
        problem = "is not a batchfold training checkpoint (no model/config/epoch)"
        raise _error(file, problem, advice)
    return payload


def _verified_body(file: Path, data: bytes, advice: str) -> bytes:
    """The payload of a checkpoint in the checked format, after its header's checks."""
    match = _HEADER.match(data[:_LONGEST_HEADER])
    if match is None:
        version = re.match(rb"batchfold-checkpoint (\d+) ", data)
        if version is not None and int(version.group(1)) > FORMAT_VERSION:
            raise _error(
                file,
                f"has format {int(version.group(1))}, newer than this batchfold's "
                f"({FORMAT_VERSION})",
                "upgrade batchfold to read it",
            )
        raise _error(file, "has a damaged or truncated header", advice)
    length, body = int(match.group(3)), data[match.end() :]
    if len(body) < length:
        raise _error(file, f"is truncated: it holds {len(body)} of {length} bytes", advice)
    if len(body) > length:
        raise _error(file, f"is damaged: {len(body) - length} bytes more than written", advice)
    if hashlib.sha256(body).hexdigest() != match.group(2).decode("ascii"):
        raise _error(file, "is damaged: its bytes do not match its SHA-256 checksum", advice)
    return body


def _error(file: Path, problem: str, advice: str) -> CheckpointError:
    return CheckpointError(f"checkpoint {file} {problem}; {advice}")


# -- random state ------------------------------------------------------------------------------


def rng_state() -> dict[str, Any]:
    """The global generators' states, as plain lists and tensors (loadable weights-only).

    Returns:
        Python's, NumPy's, PyTorch's and (when available) CUDA's generator states, for
        :func:`set_rng_state`.
    """
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # type: ignore[misc]
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "numpy": [kind, torch.from_numpy(np.asarray(keys).copy()), pos, has_gauss, cached],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore the global generators' states saved by :func:`rng_state`.

    Arguments:
        state: the saved states.
    """
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy(), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
