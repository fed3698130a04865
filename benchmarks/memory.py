"""Peak memory of one benchmark configuration, without tracemalloc.

On the CPU the measure is the rise of the process's resident memory: just before the
configuration runs, freed heap memory is handed back to the system (glibc ``malloc_trim``)
and the kernel's resident high-water mark is reset (``/proc/self/clear_refs``, value 5); after
it, the peak is the high-water mark (``VmHWM``) minus the resident size (``VmRSS``) at the
start. Where the high-water mark cannot be reset, the rise of ``getrusage``'s ``ru_maxrss``
is used instead, which misses peaks below an earlier one (the result names its method). On
CUDA the measure is ``torch.cuda.max_memory_allocated`` above the memory allocated at the
start.

Only the standard library is imported here (torch is used only when the caller has already
imported it), so that the peer systems' environments can use this module too.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import resource
import sys
from pathlib import Path
from types import TracebackType
from typing import Any

_PROC_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_kb(field: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``), or None."""
    try:
        for line in _PROC_STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _trim_heap() -> None:
    """Give freed heap memory back to the system, so that reused memory counts as growth."""
    gc.collect()
    name = ctypes.util.find_library("c")
    if not name:
        return
    try:
        libc = ctypes.CDLL(name)
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _reset_high_water_mark() -> bool:
    """Reset the kernel's resident high-water mark; whether that worked."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


def _cuda_device() -> Any:
    """The torch module when the caller has imported it and CUDA is in use, else None."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch


class PeakMemory:
    """Context manager: the peak memory a block of code adds (see the module docstring).

    Example:
        >>> with PeakMemory() as peak:
        ...     block = bytearray(64 * 2**20)
        ...     block[::4096] = b"x" * len(block[::4096])
        >>> peak.mb >= 60, peak.method in ("VmHWM", "ru_maxrss")
        (True, True)
    """

    def __init__(self) -> None:
        self.mb: float = 0.0
        self.resident_mb: float | None = None
        self.method: str = ""
        self.cuda_mb: float | None = None
        self._start_kb = 0
        self._cuda_start = 0
        self._hwm = False

    def __enter__(self) -> PeakMemory:
        _trim_heap()
        self._hwm = _reset_high_water_mark() and _status_kb("VmHWM") is not None
        if self._hwm:
            self._start_kb = _status_kb("VmRSS") or 0
        else:
            self._start_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        torch = _cuda_device()
        if torch is not None:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._cuda_start = torch.cuda.memory_allocated()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._hwm:
            peak_kb = _status_kb("VmHWM") or self._start_kb
            self.resident_mb = peak_kb / 1024
            self.method = "VmHWM"
        else:
            peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            self.method = "ru_maxrss"
        self.mb = max(peak_kb - self._start_kb, 0) / 1024
        torch = _cuda_device()
        if torch is not None:
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()
            self.cuda_mb = (peak - self._cuda_start) / 2**20

    def as_dict(self) -> dict[str, float | str | None]:
        """The JSON fields of a results row.

        Returns:
            ``peak_mb`` (the rise), ``resident_peak_mb`` (the whole process's resident peak
            during the block, where known), ``peak_method`` and ``peak_cuda_mb``.
        """
        return {
            "peak_mb": round(self.mb, 1),
            "resident_peak_mb": None if self.resident_mb is None else round(self.resident_mb, 1),
            "peak_method": self.method,
            "peak_cuda_mb": self.cuda_mb,
        }
