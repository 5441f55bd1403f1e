"""Under NeMo Gym, this server's console: every line it prints prefixed with its Gym server name, Switchyard's INFO lines off.

Gym runs each server with its stdout and stderr on Gym's own console. The hosted Switchyard writes a
few INFO lines per model call straight to file descriptor 2 (Rust's logger, not Python's), which
drowns Gym's progress output, and nothing in them says which of Gym's servers printed them. So,
started by Gym: Switchyard's log filter (`RUST_LOG`) is `warn` unless the user set one, and file
descriptors 1 and 2 are pipes whose lines a thread copies to the real ones behind `(<server name>) `,
Gym's own way of naming a server in its setup output. Python's logging, Switchyard's native code
and any child process share those descriptors, so all of them are prefixed alike.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator

RUST_LOG = "RUST_LOG"
QUIET_SWITCHYARD = "warn"  # Switchyard's warnings and errors; its per-call INFO lines off


class _Prefixer:
    """File descriptor `fd` redirected into a pipe; a thread writes each line to the original, prefixed."""

    def __init__(self, fd: int, prefix: bytes) -> None:
        self.fd = fd
        self.prefix = prefix
        self.original = os.dup(fd)
        read_end, write_end = os.pipe()
        os.dup2(write_end, fd)
        os.close(write_end)
        self._read_end = read_end
        self._thread = threading.Thread(target=self._pump, name=f"console-prefix-{fd}", daemon=True)
        self._thread.start()

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                written = os.write(self.original, view)
            except InterruptedError:
                continue
            except OSError:
                return  # the console went away: nothing left to show the lines to
            view = view[written:]

    def _pump(self) -> None:
        pending = b""
        while True:
            try:
                chunk = os.read(self._read_end, 65536)
            except InterruptedError:
                continue
            except OSError:
                break
            if not chunk:
                break
            *lines, pending = (pending + chunk).split(b"\n")
            if lines:
                self._write(b"".join(self.prefix + line + b"\n" for line in lines))
        if pending:
            self._write(self.prefix + pending + b"\n")
        os.close(self._read_end)

    def close(self) -> None:
        """The original descriptor back; what is still in the pipe is written first (for up to 2 s: a
        child process that still holds the pipe keeps it open, and Gym stops its servers quickly)."""
        os.dup2(self.original, self.fd)  # closes the pipe's last write end here: the pump sees its end
        self._thread.join(2.0)
        os.close(self.original)


@contextlib.contextmanager
def gym_console(server_name: str) -> Iterator[None]:
    """This process's console as Gym shows it, for the duration (see the module docstring)."""
    os.environ.setdefault(RUST_LOG, QUIET_SWITCHYARD)
    prefix = f"({server_name}) ".encode()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(ValueError, OSError):
            stream.flush()
    prefixers = [_Prefixer(fd, prefix) for fd in (1, 2)]
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(ValueError, OSError):
                stream.flush()
        for prefixer in reversed(prefixers):
            prefixer.close()
