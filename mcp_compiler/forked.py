"""Work beside the main thread, in a forked process: the compiler's stages are Python (or C++ that
holds the GIL, as onnx's checker and shape inference do), so a thread would only take turns with
the main one. A fork shares the model read-only, costs a few milliseconds, and the second core
does the work. Where a fork is not safe or not there -- another thread is running (a lock it holds
would stay held in the child), or no os.fork (Windows) -- the work runs in the caller, first, and
the result is the same."""

from __future__ import annotations

import os
import pickle
import threading
from collections.abc import Callable
from typing import Any


def can_fork() -> bool:
    return hasattr(os, "fork") and threading.active_count() == 1


class Beside:
    """fn() in a child process when `fork` (the caller asks can_fork()), else here and now;
    result() waits for it and gives back what fn returned (pickled through a pipe) or raises what
    it raised."""

    def __init__(self, fn: Callable[[], Any], *, fork: bool) -> None:
        self.pid: int | None = None
        self.forked = fork and hasattr(os, "fork")
        self._value: Any = None
        self._error: BaseException | None = None
        if not self.forked:
            try:
                self._value = fn()
            except BaseException as e:  # noqa: BLE001 - raised by result(), as from a child
                self._error = e
            return
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:   # the child: never returns into the caller's code
            code = 0
            try:
                os.close(r)
                try:
                    data = pickle.dumps((True, fn()))
                except BaseException as e:  # noqa: BLE001 - handed to the parent
                    code = 1
                    data = _pickled_error(e)
                view = memoryview(data)
                while view:
                    view = view[os.write(w, view):]
            finally:
                os._exit(code)
        os.close(w)
        self.pid, self._read = pid, r

    def result(self) -> Any:
        if self.pid is not None:
            self._collect()
        if self._error is not None:
            raise self._error
        return self._value

    def wait(self) -> None:
        """Wait for the child without raising what it raised (cleaning up after a failure)."""
        if self.pid is not None:
            self._collect()

    def _collect(self) -> None:
        chunks = []
        try:
            while chunk := os.read(self._read, 1 << 20):
                chunks.append(chunk)
        finally:
            os.close(self._read)
            _, status = os.waitpid(self.pid, 0)
            self.pid = None
        data = b"".join(chunks)
        if not data:
            how = (f"killed by signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
                   else f"exit status {os.waitstatus_to_exitcode(status)}")
            self._error = RuntimeError(f"the process working beside this one ended without a result ({how})")
            return
        ok, value = pickle.loads(data)
        if ok:
            self._value = value
        else:
            self._error = value


def _pickled_error(e: BaseException) -> bytes:
    """The exception, pickled; one that does not pickle (or unpickle) as a RuntimeError naming it."""
    try:
        data = pickle.dumps((False, e))
        pickle.loads(data)
        return data
    except Exception:  # noqa: BLE001 - any pickling failure: the text still goes across
        return pickle.dumps((False, RuntimeError(f"{type(e).__name__}: {e}")))
