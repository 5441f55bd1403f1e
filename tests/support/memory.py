"""Memory of a process and its children (psutil): now, and the peak while a test runs."""

from __future__ import annotations

import threading
import time

import psutil


class TreePeak:
    """The peak RSS of a process and (unless `children=False`) its children, sampled every 20 ms."""

    def __init__(self, pid: int, children: bool = True) -> None:
        self.root = psutil.Process(pid)
        self.children = children
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def rss(self) -> int:
        total = 0
        for process in [self.root, *(self.root.children(recursive=True) if self.children else ())]:
            try:
                total += process.memory_info().rss
            except psutil.Error:
                pass
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, self.rss())
            except psutil.Error:
                return
            time.sleep(0.02)

    def __enter__(self) -> TreePeak:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
