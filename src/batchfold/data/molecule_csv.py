"""Reading a molecule CSV file (a SMILES column and label columns) into a :class:`MoleculeSet`.

:func:`read_molecule_csv` featurizes every row with
:func:`~batchfold.data.molecule_features.featurize_mol`. A SMILES that rdkit cannot parse is
never turned into NaNs: the row is skipped with a :class:`SkippedMoleculeWarning`, or, with
``strict=True``, it raises :class:`MoleculeFormatError`. :mod:`batchfold.data.molecules`
re-exports these names next to the ESOL and Tox21 loaders.
"""

from __future__ import annotations

import csv
import gzip
import math
import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO, overload

from batchfold.data.molecule_features import (
    Molecule,
    MoleculeFormatError,
    featurize_mol,
    parse_smiles,
)
from batchfold.data.paths import UNREADABLE, not_utf8

__all__ = ["MoleculeSet", "SkippedMoleculeWarning", "read_molecule_csv"]


class SkippedMoleculeWarning(UserWarning):
    """A row of a molecule file was skipped because rdkit cannot parse its SMILES."""


@dataclass(frozen=True, eq=False, repr=False)
class MoleculeSet(Sequence[Molecule]):
    """The molecules read from one file, with the task names and the rows that were skipped.

    It is a sequence of :class:`Molecule`, so it can go straight to the splits.

    Arguments:
        molecules: the molecules, in file order.
        tasks: the label columns, in the order of :attr:`Molecule.label`.
        source: the file read.
        skipped: ``(line, SMILES)`` of each row whose SMILES rdkit cannot parse.
    """

    molecules: tuple[Molecule, ...]
    tasks: tuple[str, ...]
    source: str
    skipped: tuple[tuple[int, str], ...] = ()

    def __len__(self) -> int:
        return len(self.molecules)

    @overload
    def __getitem__(self, index: int) -> Molecule: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[Molecule, ...]: ...
    def __getitem__(self, index: int | slice) -> Molecule | tuple[Molecule, ...]:
        return self.molecules[index]

    def __iter__(self) -> Iterator[Molecule]:
        return iter(self.molecules)

    def __repr__(self) -> str:
        return (
            f"MoleculeSet({self.source!r}, molecules={len(self)}, tasks={len(self.tasks)}, "
            f"skipped={len(self.skipped)})"
        )


def _open(file: Path) -> TextIO:
    if file.suffix == ".gz":
        return gzip.open(file, "rt", encoding="utf-8-sig", newline="")
    return open(file, encoding="utf-8-sig", newline="")


def _label(cell: str, column: str, binary: bool, where: str) -> float | None:
    """The value of a label cell; ``None`` for an empty (unmeasured) one."""
    text = cell.strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if value in (0.0, 1.0) if binary else math.isfinite(value):
        return value
    expected = "0, 1" if binary else "a finite number"
    raise MoleculeFormatError(
        f"{where}: column {column!r}: expected {expected} or an empty cell, found {cell!r}"
    )


def read_molecule_csv(
    file: str | os.PathLike[str],
    smiles_column: str = "smiles",
    label_columns: Sequence[str] = (),
    *,
    binary: bool = False,
    strict: bool = False,
    max_pair_distance: int | None = None,
    atom_counts: bool = False,
) -> MoleculeSet:
    """Read a CSV file with a header, a SMILES column and label columns into molecules.

    Gzip-compressed files (``.gz``) and CRLF line endings are fine. An empty label cell is a
    missing label: value 0 with ``mask`` False. A row whose SMILES rdkit cannot parse is
    skipped with a :class:`SkippedMoleculeWarning` naming the file, line and SMILES, and a
    last warning gives the count; ``strict=True`` raises instead.

    Arguments:
        file: the CSV file.
        smiles_column: the header name of the SMILES column.
        label_columns: the header names of the label columns, in label order.
        binary: labels must be 0 or 1 (classification) rather than any finite number.
        strict: raise :class:`MoleculeFormatError` on a SMILES rdkit cannot parse.
        max_pair_distance: passed to :func:`featurize`.
        atom_counts: passed to :func:`featurize`.

    Returns:
        The :class:`MoleculeSet`.

    Raises:
        FileNotFoundError: there is no such file.
        MoleculeFormatError: a missing column, a row with the wrong number of fields or a bad
            label (always), or an unparsable SMILES (with ``strict``); the message starts
            with ``file:line:``.

    Example:
        >>> import tempfile, pathlib
        >>> f = pathlib.Path(tempfile.mkdtemp()) / "tiny.csv"
        >>> _ = f.write_text("smiles,y\\nCCO,1\\nC1CC,0\\nc1ccccc1,\\n")
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     data = read_molecule_csv(f, "smiles", ["y"], binary=True)
        >>> data.skipped, [m.mask.tolist() for m in data]
        (((3, 'C1CC'),), [[True], [False]])
        >>> print(caught[0].message)  # doctest: +ELLIPSIS
        /...tiny.csv:3: rdkit cannot parse SMILES 'C1CC' (not valid SMILES syntax); skipped
    """
    source = str(file)
    molecules: list[Molecule] = []
    skipped: list[tuple[int, str]] = []
    with _open(Path(file)) as f:
        reader = csv.reader(_utf8_lines(f, source))
        header = [name.strip() for name in next(reader, [])]
        wanted = [smiles_column, *label_columns]
        for name in wanted:
            if name not in header:
                raise MoleculeFormatError(
                    f"{source}:1: no column {name!r} in the header (it has {', '.join(header)})"
                )
        smiles_at, *label_at = (header.index(name) for name in wanted)
        for row in reader:
            where = f"{source}:{reader.line_num}"
            if not any(cell.strip() for cell in row):
                continue
            if len(row) != len(header):
                raise MoleculeFormatError(
                    f"{where}: expected {len(header)} fields, found {len(row)}"
                )
            labels = [
                _label(row[i], name, binary, where)
                for i, name in zip(label_at, label_columns, strict=True)
            ]
            smiles = row[smiles_at].strip()
            mol, reason = parse_smiles(smiles)
            if mol is None:
                message = f"{where}: rdkit cannot parse SMILES {smiles!r} ({reason})"
                if strict:
                    raise MoleculeFormatError(message)
                warnings.warn(f"{message}; skipped", SkippedMoleculeWarning, stacklevel=2)
                skipped.append((reader.line_num, smiles))
                continue
            molecules.append(
                featurize_mol(
                    mol,
                    smiles,
                    labels,
                    max_pair_distance=max_pair_distance,
                    atom_counts=atom_counts,
                )
            )
    if skipped:
        warnings.warn(
            f"{source}: skipped {len(skipped)} of {len(skipped) + len(molecules)} molecules "
            "whose SMILES rdkit cannot parse (strict=True makes this an error)",
            SkippedMoleculeWarning,
            stacklevel=2,
        )
    return MoleculeSet(tuple(molecules), tuple(label_columns), source, tuple(skipped))


def _utf8_lines(lines: Iterator[str], source: str) -> Iterator[str]:
    """``lines``, with a file that is not UTF-8 text named in the error."""
    try:
        yield from lines
    except UNREADABLE as error:
        raise not_utf8(source, error) from None
