"""Nagle's algorithm is off on every TCP connection this server accepts or makes, whatever carries it.

Read on the sockets themselves: the test takes a duplicate of each socket descriptor the server
process holds (pidfd_getfd) and reads its TCP_NODELAY. Without uvloop (asyncio's own loop), a
listening socket made with protocol 0 handed connections with Nagle on to uvicorn, its workers and
granian: ~40 ms per call to a keep-alive client. uvloop is hidden from the server by a module of
that name on PYTHONPATH that fails to import, as it fails where uvloop is not installed.
"""

from __future__ import annotations

import http.client

import psutil
import pytest

from tests.support.procs import free_port, scratch_dir, start_server
from tests.support.tcp import PeerSocket, tcp_sockets_of


def _hidden_uvloop_path() -> str:
    folder = scratch_dir() / "no-uvloop"
    folder.mkdir(exist_ok=True)
    (folder / "uvloop.py").write_text("raise ModuleNotFoundError(\"No module named 'uvloop'\", name='uvloop')\n")
    return str(folder)


def _sockets_of_tree(pid: int) -> list[PeerSocket]:
    found: list[PeerSocket] = []
    for process in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
        sockets = tcp_sockets_of(process.pid)
        if sockets is None:
            pytest.skip("this kernel does not let a test read another process's sockets (pidfd_getfd)")
        found += sockets
    return found


CASES = [
    ("granian", (), False),
    ("granian", (), True),
    ("uvicorn", (), True),
    ("uvicorn", ("--workers", "2"), True),
]


@pytest.mark.parametrize(
    ("impl", "extra", "hide_uvloop"),
    CASES,
    ids=["granian", "granian-no-uvloop", "uvicorn-no-uvloop", "workers-no-uvloop"],
)
def test_nagle_is_off_on_every_connection_the_server_accepts_or_makes(mock_upstream, impl, extra, hide_uvloop):
    proxy_port = free_port()
    env = {"MOCK_UPSTREAM_URL": mock_upstream + "/v1"}
    if hide_uvloop:
        env["PYTHONPATH"] = _hidden_uvloop_path()
    proc, base = start_server(
        "--deployment",
        "demo",
        "--no-capture",
        "--http-server",
        impl,
        "--proxy-port",
        str(proxy_port),
        *extra,
        env=env,
    )
    try:
        port = int(base.rsplit(":", 1)[1])
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        connection.request(
            "POST",
            "/v1/chat/completions",
            body=b'{"model": "x", "messages": [{"role": "user", "content": "hi"}]}',
            headers={"content-type": "application/json"},
        )
        response = connection.getresponse()
        assert response.status == 200 and response.read()
        assert connection.sock is not None
        client_end = connection.sock.getsockname()[:2]
        sockets = _sockets_of_tree(proc.pid)
        connection.close()

        listening = [s for s in sockets if s.local[1] == port and s.peer is None]
        accepted = [s for s in sockets if s.local[1] == port and s.peer == client_end]
        to_switchyard = [s for s in sockets if s.peer is not None and s.peer[1] == proxy_port]
        assert listening and accepted and to_switchyard, sockets
        assert all(s.nodelay for s in listening + accepted + to_switchyard), sockets
        if hide_uvloop:
            output = proc.output()
            warnings = [line for line in output.splitlines() if "uvloop" in line]
            if impl == "granian":  # the default server says once that it runs on asyncio's loop
                assert len(warnings) == 1 and "asyncio" in warnings[0], output[-3000:]
            assert "Traceback" not in output, output[-3000:]
    finally:
        proc.stop()
