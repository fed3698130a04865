"""Sync points: instances that read a value pause, and resume together after one batched run.

``batch_map`` runs each instance's code in its own greenlet. When the code reads a value that
has not been computed (``.item()``, ``bool()`` in an ``if``, ``int()``, ``.tolist()``), the
instance switches back to the driver, which moves on to the next instance. Once every instance
is paused or finished, the driver runs everything recorded so far as one plan and resumes the
paused instances, in instance order, each with its value. A greedy decoder over a batch thus
runs one batched plan per decoding step, not one per instance per step.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from greenlet import GreenletExit, getcurrent, greenlet

_PAUSED = object()  # what an instance's greenlet hands the driver when it waits for a value
_EXIT_TRIES = 3
_ABANDONED: list[Any] = []  # instances that would not exit: never resumed, never collected


class Driver:
    """Runs the instances of one ``batch_map`` as greenlets and batches across their reads.

    Arguments:
        flush: runs every node recorded so far (the recorder's ``flush``).
        set_instance: tells the recorder which instance is recording now.
    """

    def __init__(self, flush: Callable[[], None], set_instance: Callable[[int], None]) -> None:
        self.flush, self.set_instance = flush, set_instance
        self.main: Any = None  # the driver's greenlet while it runs, else None
        self.syncs = 0  # flushes made because instances waited on values

    def pause(self) -> None:
        """Called by a read inside an instance: wait until the driver has run the graph."""
        grad = torch.is_grad_enabled()
        self.main.switch(_PAUSED)
        torch.set_grad_enabled(grad)  # the driver and other instances may have changed it

    @property
    def in_instance(self) -> bool:
        """Whether the caller runs inside an instance's greenlet of this driver."""
        return self.main is not None and getcurrent() is not self.main

    def run(self, fn: Callable[[Any], Any], instances: Iterable[Any]) -> list[Any]:
        """``[fn(x) for x in instances]``, recorded with sync points; lazy results."""
        self.main = getcurrent()
        results: list[Any] = []
        paused: dict[int, Any] = {}  # instance index -> its greenlet, waiting for a value
        try:
            for index, instance in enumerate(instances):
                results.append(None)
                self._step(index, greenlet(fn), (instance,), results, paused)
            while paused:
                self.flush()
                self.syncs += 1
                for index, task in list(paused.items()):
                    self._step(index, task, (), results, paused)
        except BaseException as error:
            self._end(paused, error)
            raise
        finally:
            self.main = None
        return results

    def _end(self, paused: dict[int, Any], error: BaseException) -> None:
        """After an error, end the paused instances, each with a bounded number of tries.

        An instance that catches ``GreenletExit`` and waits for a value again is told to exit
        a few times, then left paused for good (kept alive, so that it never runs again when
        collected); the error says which.
        """
        stuck = []
        for index, task in paused.items():
            for _ in range(_EXIT_TRIES):
                if task.dead:
                    break
                try:
                    task.throw(GreenletExit)
                except BaseException:  # what the instance raised while ending; error wins
                    break
            if not task.dead:
                stuck.append(index)
                _ABANDONED.append(task)
        if stuck:
            notes = [*getattr(error, "__notes__", [])]
            notes.append(
                f"(instances {stuck} of batch_map kept waiting for values after being told to "
                f"exit {_EXIT_TRIES} times, e.g. in a try/except BaseException loop; they were "
                "left paused)"
            )
            setattr(error, "__notes__", notes)  # noqa: B010

    def _step(
        self,
        index: int,
        task: Any,
        args: tuple[Any, ...],
        results: list[Any],
        paused: dict[int, Any],
    ) -> None:
        """Run one instance until it pauses at a read or returns."""
        grad = torch.is_grad_enabled()
        self.set_instance(index)
        try:
            out = task.switch(*args)
        except Exception as error:
            paused.pop(index, None)
            # what BaseException.add_note does on 3.11+ (which prints notes under the traceback)
            notes = [*getattr(error, "__notes__", []), f"(raised by instance {index} of batch_map)"]
            setattr(error, "__notes__", notes)  # noqa: B010
            raise
        finally:
            torch.set_grad_enabled(grad)
        if task.dead:
            results[index] = out
            paused.pop(index, None)
        else:
            assert out is _PAUSED, "an instance switched greenlets outside batchfold"
            paused[index] = task
