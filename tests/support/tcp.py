"""TCP-level helpers: the kernel's delayed-ACK counter, a server that leaves Nagle's algorithm on, and
another process's TCP sockets with their options.

A server with Nagle on holds each small write until the previous one is acknowledged; a client
delays its ACKs (40 ms on Linux) when it has nothing to send. Together they stall a streamed answer
on a kept-alive connection. The kernel counts every ACK it delayed, so a test can see the stall
without timing anything.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import threading
from dataclasses import dataclass
from pathlib import Path


def delayed_acks() -> int | None:
    """How many ACKs this network namespace's kernel has delayed (Linux's TcpExt DelayedACKs), or None."""
    try:
        lines = Path("/proc/net/netstat").read_text().splitlines()
    except OSError:
        return None
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            counters = dict(zip(names.split()[1:], values.split()[1:], strict=False))
            return int(counters["DelayedACKs"]) if "DelayedACKs" in counters else None
    return None


class NaglingStreamServer:
    """A keep-alive HTTP/1.1 server that, like Switchyard 0.3.0, leaves Nagle's algorithm on and writes
    each answer (a chunked stream of one chunk) as three small writes: head, chunk, end."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> NaglingStreamServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() (a close alone would not)
        self.listener.close()
        self.thread.join(5)

    def _serve(self) -> None:
        try:
            while True:
                conn, _ = self.listener.accept()
                self.connections += 1
                threading.Thread(target=self._answer, args=(conn,), daemon=True).start()
        except OSError:  # the listener was shut down
            return

    def _answer(self, conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0)
        buffer = b""
        with conn:
            while True:
                while not _whole_request(buffer):
                    data = conn.recv(65536)
                    if not data:
                        return
                    buffer += data
                head, _, rest = buffer.partition(b"\r\n\r\n")
                buffer = rest[_content_length(head) :]
                for piece in (
                    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
                    b"5\r\nfirst\r\n",
                    b"0\r\n\r\n",
                ):
                    conn.sendall(piece)


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def _whole_request(buffer: bytes) -> bool:
    head, found, rest = buffer.partition(b"\r\n\r\n")
    return bool(found) and len(rest) >= _content_length(head)


@dataclass(frozen=True)
class PeerSocket:
    """One TCP socket of another process, as that process holds it."""

    pid: int
    local: tuple[str, int]
    peer: tuple[str, int] | None  # None for a listening socket
    nodelay: bool


_PIDFD_GETFD = 438  # the syscall number on x86-64 and arm64 (Linux 5.6+)


def tcp_sockets_of(pid: int) -> list[PeerSocket] | None:
    """Every TCP socket `pid` holds open, with its TCP_NODELAY read on the very socket (a duplicate of
    its descriptor taken with pidfd_getfd); None where the kernel does not let this process do that."""
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None
    found = []
    try:
        for name in os.listdir(f"/proc/{pid}/fd"):
            try:
                if not os.readlink(f"/proc/{pid}/fd/{name}").startswith("socket:"):
                    continue
            except OSError:  # closed meanwhile
                continue
            fd = libc.syscall(_PIDFD_GETFD, pidfd, int(name), 0)
            if fd < 0:
                if ctypes.get_errno() in (errno.EPERM, errno.ENOSYS):
                    return None
                continue
            with socket.socket(fileno=fd) as sock:
                if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET, socket.AF_INET6):
                    continue
                try:
                    peer = sock.getpeername()[:2]
                except OSError:
                    peer = None
                nodelay = bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                found.append(PeerSocket(pid, sock.getsockname()[:2], peer, nodelay))
    finally:
        os.close(pidfd)
    return found
