"""A served model's stub ends with its tritonserver. Triton's python stub watches its parent,
but one killed while it was loading a model was seen sleeping for minutes after tritonserver
had died (mcp-cli tune, SIGKILL): its memory and the model's threads with it. The stub's first
import of our code starts a daemon thread that ends the process once its parent is gone (the
stub is then a child of another process)."""

from __future__ import annotations

import os
import threading

_started = False


def exit_with_parent(every_s: float = 0.5) -> None:
    """Once per process: end it (os._exit) when the process that started it has ended."""
    global _started
    if _started:
        return
    _started = True
    parent = os.getppid()

    def watch() -> None:
        while True:
            threading.Event().wait(every_s)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="mcp-exit-with-parent", daemon=True).start()
