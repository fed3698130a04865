"""Where data sets are found: an explicit path, ``$BATCHFOLD_DATA``, or a ``shared/data`` folder.

Loaders call :func:`find_data` with the name of a data folder (``"sst"``, ``"glove-sst"``, ...).
The search order is: the path the user gave; ``$BATCHFOLD_DATA/<name>``; ``shared/data/<name>``
and ``../shared/data/<name>`` relative to the working directory and to the source checkout.
Downloads go to :func:`cache_dir`.
"""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path

_CHECKOUT = Path(__file__).resolve().parents[3]


def cache_dir(name: str) -> Path:
    """The folder that downloaded copies of data set ``name`` are kept in.

    Arguments:
        name: the data set's folder name, such as ``"sst"``.

    Returns:
        ``$BATCHFOLD_CACHE/<name>`` when that variable is set, else
        ``~/.cache/batchfold/<name>``.

    Example:
        >>> cache_dir("sst").name
        'sst'
    """
    root = os.environ.get("BATCHFOLD_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "batchfold"
    return base / name


def data_roots() -> list[Path]:
    """Folders searched for data sets, in order.

    Returns:
        The candidate ``data`` folders (they need not exist).
    """
    roots = []
    if env := os.environ.get("BATCHFOLD_DATA"):
        roots.append(Path(env))
    for base in (Path.cwd(), _CHECKOUT):
        roots += [base / "shared" / "data", base.parent / "shared" / "data"]
    return roots


def find_data(name: str, path: str | os.PathLike[str] | None = None) -> Path | None:
    """The folder holding data set ``name``, or ``None`` when it is nowhere to be found.

    Arguments:
        name: the data set's folder name, such as ``"sst"``.
        path: a folder the user named; when given, it is the only place looked at.

    Returns:
        An existing folder, or ``None``.

    Example:
        >>> find_data("no-such-data-set") is None
        True
    """
    if path is not None:
        candidate = Path(path)
        return candidate if candidate.exists() else None
    for root in data_roots():
        if (root / name).is_dir():
            return root / name
    return None


UNREADABLE = (UnicodeDecodeError, EOFError, gzip.BadGzipFile, zlib.error)
"""What reading a data file's text raises where the file is not UTF-8 text or not a whole
gzip file (one an interrupted download cut short): see :func:`not_utf8`."""


def not_utf8(file: str | os.PathLike[str], error: Exception, line: int = 0) -> ValueError:
    """The error for a data file that is not UTF-8 text, or a ``.gz`` file that is cut short
    or damaged (``error``, one of :data:`UNREADABLE`; ``line``: where, if known)."""
    where = f"{file}:{line}" if line else str(file)
    if isinstance(error, UnicodeDecodeError):
        return ValueError(f"{where}: not UTF-8 text ({error.reason}); save the file as UTF-8")
    return ValueError(
        f"{where}: not a whole gzip file ({error}); it may be cut short (an interrupted "
        "download): get it again"
    )
