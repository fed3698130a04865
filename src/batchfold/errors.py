"""Errors raised by batchfold, each naming what went wrong, where, and a likely fix.

Every class subclasses :class:`BatchfoldError` and the matching built-in error
(``ValueError``, ``TypeError``, ...), so existing ``except`` clauses keep working; catch
``BatchfoldError`` for all of them. Every class is defined here and also importable from
``batchfold`` (and from the module that raises it, where it was first defined).

Which error, and when:

Recording and running per-instance code (``batch_map``, ``bf.function``):

- :class:`ShapeError`: an op got per-instance inputs whose shapes it cannot take, or a
  ``bf.function(batched=True)`` returned the wrong shape; names the user's file and line.
  :class:`IndexShapeError`, one of them that is also an ``IndexError``: an index out of an
  instance's range, where eager PyTorch raises an ``IndexError``; :class:`ArgumentShapeError`,
  one that is also a ``TypeError``: arguments an op does not take.
- :class:`DeviceError`: one op mixed tensors on different devices.
- :class:`DtypeError`: one op mixed floating-point dtypes (batchfold never casts silently).
- :class:`UnsupportedOpError`: an op cannot be recorded lazily (its output shape depends on
  values, it returns a Python value, or it writes in place where a view would see it).
- :class:`LazyValueError`: a lazy value was used after its ``batch_map`` returned, or in
  another ``batch_map``.
- :class:`BatchingRuleError`: a batching rule failed or returned a result unlike the
  recorded op's; a bug in batchfold, to be reported.
- :class:`GraphError`: :meth:`batchfold.graph.Graph.lint` found a broken graph (a front end's
  bug, or a graph built by hand).

Blocks (``batchfold.blocks``):

- :class:`BlockTypeError`: a block was composed with an input type it cannot take.
- :class:`BlockInputError`: a Python input does not fit the block that reads it (found while
  a batch is recorded).

Data files (``batchfold.data``):

- :class:`SSTFormatError`: a malformed line of a Stanford Sentiment Treebank file.
- :class:`ConlluFormatError`: a malformed CoNLL-U file or string.
- :class:`MoleculeFormatError`: a SMILES rdkit cannot parse, or a malformed molecule file row.

Training and the command line (``batchfold.training``, the ``batchfold`` command):

- :class:`ConfigError`: training options that cannot work together (``--resume`` with a
  changed model size, an output folder that cannot be made, ...).
- :class:`CheckpointError`: a checkpoint file that is empty, truncated, damaged or not a
  batchfold checkpoint.
- :class:`CommandLineError`: a command line naming no known command or task, or a task
  module that cannot be loaded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .blocks.types import Type

__all__ = [
    "ArgumentShapeError",
    "BatchfoldError",
    "BatchingRuleError",
    "BlockInputError",
    "BlockTypeError",
    "CheckpointError",
    "CommandLineError",
    "ConfigError",
    "ConlluFormatError",
    "DeviceError",
    "DtypeError",
    "GraphError",
    "IndexShapeError",
    "LazyValueError",
    "MoleculeFormatError",
    "SSTFormatError",
    "ShapeError",
    "UnsupportedOpError",
]


def add_note(error: BaseException, note: str) -> None:
    """``error.add_note(note)``, also on Python 3.10 (3.11 prints notes under the traceback)."""
    setattr(error, "__notes__", [*getattr(error, "__notes__", []), note])  # noqa: B010


class BatchfoldError(Exception):
    """Base class of every error batchfold raises on purpose."""


class LazyValueError(BatchfoldError, RuntimeError):
    """A lazy value was used outside the ``batch_map`` call that recorded it."""


class ShapeError(BatchfoldError, ValueError):
    """An operation got arguments whose shapes do not fit; names the user's file and line."""


class IndexShapeError(ShapeError, IndexError):
    """A :class:`ShapeError` where eager PyTorch raises an ``IndexError`` (an index out of an
    instance's range): code that catches ``IndexError`` catches it too."""


class ArgumentShapeError(ShapeError, TypeError):
    """A :class:`ShapeError` where eager PyTorch raises a ``TypeError`` (arguments an op does
    not take): code that catches ``TypeError`` (NumPy's ``np.argmax(x)`` falling back to an
    array) catches it too."""


class DeviceError(BatchfoldError, ValueError):
    """One operation mixed tensors on different devices."""


class DtypeError(BatchfoldError, TypeError):
    """One operation mixed floating-point dtypes; batchfold never casts silently."""


class CheckpointError(BatchfoldError, ValueError):
    """A checkpoint file that is empty, truncated, damaged or not a batchfold checkpoint."""


class UnsupportedOpError(BatchfoldError, NotImplementedError):
    """An operation cannot be recorded lazily (for example, its output shape depends on values)."""


class BatchingRuleError(BatchfoldError, RuntimeError):
    """A batching rule failed or gave a result unlike the recorded op's: a batchfold bug."""


class GraphError(BatchfoldError, RuntimeError):
    """A graph breaks an invariant :meth:`~batchfold.graph.Graph.lint` checks.

    The message names the signature (and where its first node was recorded) and the node.
    Front ends only build valid graphs, so outside hand-built graphs this is a batchfold bug.
    """


def short(obj: Any, limit: int = 90) -> str:
    """``repr(obj)`` cut to ``limit`` characters, for error messages."""
    text = repr(obj)
    return text if len(text) <= limit else text[: limit - 4] + " ...)"


class BlockTypeError(BatchfoldError, TypeError):
    """A block got an input of a type it cannot take; raised when blocks are composed.

    The message names the block and where it sits in the model, what it expects and what it
    got, and, inside a ``Pipe``, the block whose output that was.

    Attributes:
        block: the block that refused its input.
        path: where that block sits (``model[2].cases[0]``).
        got: the input type it was given.
    """

    def __init__(
        self,
        block: Any,
        path: str,
        expected: str,
        got: Type | None,
        hint: str = "",
        source: str = "",
        verb: str = "expects",
    ) -> None:
        self.block, self.path, self.expected, self.got = block, path, expected, got
        self.hint, self.source, self.verb = hint, source, verb
        self.entries = [path]  # paths whose input ``got`` is (a Pipe's first block's is the Pipe's)
        given = "" if got is None else f", got {got!r}" if verb == "expects" else f", not {got!r}"
        text = f"{short(block)} at {path} {verb} {expected}{given}{source}."
        super().__init__(text + (f" {hint}" if hint else ""))

    def with_source(self, block: Any, path: str) -> BlockTypeError:
        """The same error, saying which block's output the refused input was."""
        return BlockTypeError(
            self.block,
            self.path,
            self.expected,
            self.got,
            self.hint,
            f" from {short(block)} at {path}",
            self.verb,
        )


class BlockInputError(BatchfoldError, ValueError):
    """A Python input does not fit the block that reads it (found while recording a batch)."""


class SSTFormatError(BatchfoldError, ValueError):
    """A line of an SST file is not a well-formed labelled PTB tree.

    The message reads ``file:line:column: expected ..., found ...`` (the column is 1-based).

    Example:
        >>> from batchfold.data.sst import parse_tree
        >>> try:
        ...     parse_tree("(2 a", source="x.txt", line_no=3)
        ... except SSTFormatError as err:
        ...     print(err)
        x.txt:3:5: expected ')', found end of line
    """


class ConlluFormatError(BatchfoldError, ValueError):
    """A CoNLL-U file or string does not hold well-formed basic dependency trees.

    The message reads ``file:line: sentence 'id': expected ..., found ...``.

    Example:
        >>> from batchfold.data.conllu import parse_conllu
        >>> try:
        ...     parse_conllu("1\\tHi\\thi\\tINTJ\\t_\\t_\\t2\\troot\\t_\\t_\\n", source="x.conllu")
        ... except ConlluFormatError as err:
        ...     print(err)
        x.conllu:1: sentence #1: expected a HEAD in 0..1, found 2
    """


class MoleculeFormatError(BatchfoldError, ValueError):
    """A SMILES that rdkit cannot parse, or a malformed row of a molecule data file.

    Messages from files read ``file:line: ...``.

    Example:
        >>> from batchfold.data.molecule_features import featurize
        >>> try:
        ...     featurize("C1CC")
        ... except MoleculeFormatError as err:
        ...     print(err)
        rdkit cannot parse SMILES 'C1CC' (not valid SMILES syntax)
    """


class ConfigError(BatchfoldError, ValueError):
    """Options that cannot work together, such as ``--resume`` with a changed model size."""


class CommandLineError(BatchfoldError, Exception):
    """A command line that names no known command or task, or a task that cannot be loaded."""


LAZY_AFTER_RUN = """\
{what} of a lazy value recorded by batch_map, after that batch_map call returned.
Lazy values live only inside the function given to batch_map; use the tensors it returns:

    wrong:  batch_map(lambda t: saved.append(encode(t)), trees); saved[0] + 1
    right:  roots = batch_map(encode, trees); roots[0] + 1"""
