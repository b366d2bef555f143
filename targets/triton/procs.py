"""The memory of a served model's processes: the server and its python-backend stubs."""

from __future__ import annotations

import os
import threading


class PeakRss:
    """The peak resident memory of a process and its children (the server and its stubs)."""

    def __init__(self, pid: int | None, every: float = 0.2) -> None:
        self.pid, self.every = pid, every
        self.peak_mb: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PeakRss:
        if self.pid is not None:
            self._thread = threading.Thread(target=self._watch, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)

    def _watch(self) -> None:
        while not self._stop.is_set():
            mb = tree_rss_mb(self.pid)
            if mb is not None:
                self.peak_mb = round(max(self.peak_mb or 0.0, mb), 1)
            self._stop.wait(self.every)


def tree_rss_mb(pid: int) -> float | None:
    """Resident memory of `pid` and its descendants, MB (Linux /proc), or None."""
    try:
        children: dict[int, list[int]] = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open(f"/proc/{d}/stat", "rb") as f:
                        ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    continue
                children.setdefault(ppid, []).append(int(d))
        total, todo = 0, [pid]
        while todo:
            p = todo.pop()
            todo += children.get(p, [])
            try:
                with open(f"/proc/{p}/statm") as f:
                    total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            except (OSError, ValueError, IndexError):
                continue
        return total / 2**20
    except OSError:
        return None
