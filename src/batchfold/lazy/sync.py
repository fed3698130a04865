"""Sync points: instances that read a value pause, and resume together after one batched run.

``batch_map`` runs the instances' code in greenlets, one after another in the same greenlet
until one reads a value that has not been computed (``.item()``, ``bool()`` in an ``if``,
``int()``, ``.tolist()``): that instance switches back to the driver, which goes on with the
next instance in a new greenlet. Once every instance
is paused or finished, the driver runs everything recorded so far as one plan and resumes the
paused instances, in instance order, each with its value. A greedy decoder over a batch thus
runs one batched plan per decoding step, not one per instance per step.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterable
from typing import Any

import torch
from greenlet import GreenletExit, getcurrent, greenlet

from ..errors import add_note

_set_grad = torch._C._set_grad_enabled  # what torch.set_grad_enabled(b) does, without its object
_modes = torch._C._len_torch_function_stack
_pop_mode = torch._C._pop_torch_function_stack
_push_mode = torch._C._push_on_torch_function_stack
_AUTOGRAD: Any = torch._C._autograd  # pyright: ignore[reportAttributeAccessIssue]
_top_hooks = _AUTOGRAD._top_saved_tensors_default_hooks
_pop_hooks = _AUTOGRAD._pop_saved_tensors_default_hooks
_push_hooks = _AUTOGRAD._push_saved_tensors_default_hooks
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
        self.current = 0  # the instance running now, or the last one to run
        self.stopping = False  # set when an instance raised: no new instance starts
        self.modes = 0  # the depth of the torch function mode stack the instances start at
        self.hooks: Any = None  # the saved-tensor hooks they start with

    def pause(self) -> None:
        """Called by a read inside an instance: wait until the driver has run the graph.

        The torch function modes (``with torch.device(...)``) and saved-tensor hooks
        (``torch.utils.checkpoint``) the instance entered leave with it: the driver's run and
        the other instances see only their own.
        """
        grad = torch.is_grad_enabled()
        modes = [_pop_mode() for _ in range(_modes() - self.modes)][::-1]
        hooks = self._pop_hooks()
        try:
            if torch.is_inference_mode_enabled():  # the driver and the others run outside
                with torch.inference_mode(False):  # it; leaving restores this instance's
                    self.main.switch(_PAUSED)
            else:
                self.main.switch(_PAUSED)
        finally:
            for mode in modes:
                _push_mode(mode)
            for pack, unpack in hooks:
                _push_hooks(pack, unpack)
        _set_grad(grad)  # the driver and other instances may have changed it

    def _pop_hooks(self) -> list[tuple[Any, Any]]:
        """The saved-tensor hooks the waiting instance entered (``torch.utils.checkpoint``),
        taken off, in the order to put them back: the batched run must not save through them
        (a checkpoint's recomputation would run the instance's code on lazy values)."""
        popped: list[tuple[Any, Any]] = []
        while (top := _top_hooks(False)) is not None and (
            self.hooks is None or top[0] is not self.hooks[0] or top[1] is not self.hooks[1]
        ):
            popped.append(top)
            _pop_hooks()
        return popped[::-1]

    @property
    def in_instance(self) -> bool:
        """Whether the caller runs inside an instance's greenlet of this driver."""
        return self.main is not None and getcurrent() is not self.main

    def run(self, fn: Callable[[Any], Any], instances: Iterable[Any]) -> list[Any]:
        """``[fn(x) for x in instances]``, recorded with sync points; lazy results.

        One greenlet runs instance after instance until one waits for a value; the next
        greenlet goes on with the next instance (a greenlet per instance would cost a switch
        each, where most code never waits).
        """
        self.main = getcurrent()
        self.modes = _modes()  # the torch function modes every instance starts with
        self.hooks = _top_hooks(False)  # and the saved-tensor hooks
        results: list[Any] = []
        paused: dict[int, Any] = {}  # instance index -> its greenlet, waiting for a value
        todo = enumerate(instances)
        grad = torch.is_grad_enabled()
        failed: list[tuple[int, Exception]] = []  # the first instance's error, in eager order
        try:
            while not failed:
                worker = greenlet(self._work)
                worker.gr_context = self.main.gr_context  # the caller's ContextVars, as eagerly
                try:
                    out = worker.switch(fn, todo, results)
                except Exception as error:
                    failed.append((self.current, error))
                    break
                finally:
                    _set_grad(grad)
                if worker.dead:
                    break
                assert out is _PAUSED, "an instance switched greenlets outside batchfold"
                paused[self.current] = worker
            while paused:
                if failed:  # eagerly the instances before it run on, and none after it
                    self._fail(failed, paused)
                    if not paused:
                        break
                self.flush()
                self.syncs += 1
                for index, task in list(paused.items()):
                    if failed and index > failed[0][0]:
                        continue  # ended by _fail
                    try:
                        self._resume(index, task, paused)
                    except Exception as error:
                        if not failed or index < failed[0][0]:
                            failed[:] = [(index, error)]
            if failed:
                raise failed[0][1]
        except BaseException as error:
            self.stopping = True
            self._end(paused, error)
            raise
        finally:
            self.main = None
            self.stopping = False
        return results

    def _work(
        self, fn: Callable[[Any], Any], todo: Iterable[tuple[int, Any]], results: list[Any]
    ) -> None:
        """Run the instances left in ``todo`` in this greenlet, until one waits for a value
        (then the driver starts another greenlet for the rest)."""
        for index, instance in todo:
            if self.stopping:  # an instance raised: a waiting one that ended takes no more
                return
            results.append(None)
            self.current = index
            self.set_instance(index)
            grad = torch.is_grad_enabled()
            try:
                out = _in_own_context(fn, instance)
            except Exception as error:
                _note_instance(error, index)
                raise
            finally:
                _set_grad(grad)
            results[index] = out

    def _fail(self, failed: list[tuple[int, Exception]], paused: dict[int, Any]) -> None:
        """After instance ``failed[0][0]`` raised, end the paused instances after it, which
        eager code never runs; the ones before it run on, and may raise first."""
        self.stopping = True
        later = {index: task for index, task in paused.items() if index > failed[0][0]}
        self._end(later, failed[0][1])
        for index in later:
            paused.pop(index)

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
            add_note(
                error,
                f"(instances {stuck} of batch_map kept waiting for values after being told to "
                f"exit {_EXIT_TRIES} times, e.g. in a try/except BaseException loop; they were "
                "left paused)",
            )

    def _resume(self, index: int, task: Any, paused: dict[int, Any]) -> None:
        """Run a waiting instance on until it waits again or returns (its greenlet stores the
        result: see :meth:`_work`)."""
        grad = torch.is_grad_enabled()
        self.current = index
        self.set_instance(index)
        try:
            out = task.switch()
        except Exception:
            paused.pop(index, None)  # the note was added inside (see _work)
            raise
        finally:
            _set_grad(grad)
        if task.dead:
            paused.pop(index, None)
        else:
            assert out is _PAUSED, "an instance switched greenlets outside batchfold"
            paused[index] = task


def _note_instance(error: BaseException, index: int) -> None:
    add_note(error, f"(raised by instance {index} of batch_map)")


def _in_own_context(fn: Callable[[Any], Any], instance: Any) -> Any:
    """``fn(instance)`` in a copy of the caller's context, whose sets reach the caller's when
    it returns or raises: eagerly instances run one after another in one context, so one that
    waits inside a ``with`` block that sets a ``ContextVar`` must not see another's value (nor
    another its), while a value an instance leaves set reaches the later ones and the caller.
    Values are compared by identity (a tensor's ``==`` is no truth value)."""
    start = contextvars.copy_context()
    own = start.copy()
    try:
        return own.run(fn, instance)
    finally:
        for var, value in own.items():  # what this instance set, over what it started from
            if start.get(var, _UNSET) is not value:
                var.set(value)


_UNSET = object()
