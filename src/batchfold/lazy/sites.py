"""Where a call was made and what to call it: the user's file and line, an op's short name."""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from typing import Any

import torch

Tensor = torch.Tensor
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_CONTEXTLIB = os.path.abspath(contextlib.__file__)  # a with-block's exit, run on the user's behalf
_LEADING = ("input", "tensors", "self")  # parameter names that come first when passed by name


@functools.lru_cache(maxsize=4096)
def _is_user_file(filename: str) -> bool:
    path = os.path.abspath(filename)
    if path == _CONTEXTLIB:
        return False
    return not path.startswith((_PACKAGE_DIR, _TORCH_DIR)) or "/tests/" in path


def user_site() -> str:
    """``file:line`` of the innermost caller outside batchfold and PyTorch."""
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if _is_user_file(code.co_filename):
            return f"{code.co_filename}:{frame.f_lineno} (in {code.co_name})"
        frame = frame.f_back
    return "<unknown>"


def inside_torch() -> str:
    """`` (inside PyTorch's file:line, in function)`` when the innermost caller outside
    batchfold is PyTorch's own code (a distribution's ``rsample`` writing in place), else
    ``""``: an error about the call then names whose code made it."""
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR):
        frame = frame.f_back
    if frame is None or _is_user_file(frame.f_code.co_filename):
        return ""
    path = os.path.relpath(os.path.abspath(frame.f_code.co_filename), os.path.dirname(_TORCH_DIR))
    return f" (inside PyTorch's {path}:{frame.f_lineno}, in {frame.f_code.co_name})"


def version(tensor: Tensor) -> int:
    """How often ``tensor`` was changed in place (-1 for inference tensors, which never are)."""
    try:
        return tensor._version
    except RuntimeError:
        return -1


def func_name(func: Any) -> str:
    """A short readable name for a PyTorch function, method or batched function."""
    name = getattr(func, "__name__", None) or type(func).__name__
    return name.strip("_") if name.startswith("__") else name
