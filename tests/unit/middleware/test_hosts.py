"""The Host allow-list and the JSON-only rule, case by case."""

from __future__ import annotations

import socket

import pytest

from middleware.hosts import HostAllowList, is_json_request


def scope(*headers: tuple[bytes, bytes]) -> dict:
    return {"headers": list(headers)}


def host(value: bytes) -> dict:
    return scope((b"host", value))


@pytest.mark.parametrize(
    ("bound", "allowed", "refused"),
    [
        (
            "127.0.0.1",
            [b"127.0.0.1:8080", b"localhost", b"LOCALHOST:1", b"[::1]:8080"],
            [b"10.1.2.3", b"evil.example:80"],
        ),
        ("::1", [b"[::1]:1", b"localhost"], [b"evil.example"]),
        ("10.0.0.5", [b"10.0.0.5:8080", b"127.0.0.1"], [b"10.0.0.6", b"evil.example"]),
        ("0.0.0.0", [b"10.1.2.3:8080", b"[fe80::1]:80", socket.gethostname().encode()], [b"evil.example"]),
    ],
)
def test_host_allow_list(bound, allowed, refused):
    hosts = HostAllowList(bound)
    assert all(hosts.allows(host(value)) for value in allowed)
    assert not any(hosts.allows(host(value)) for value in refused)
    assert not hosts.allows(scope())  # no Host at all


def test_allowed_hosts_add_names_and_star_turns_the_check_off():
    assert HostAllowList("127.0.0.1", ["Gateway.Internal"]).allows(host(b"gateway.internal:443"))
    assert HostAllowList("127.0.0.1", ["*"]).allows(host(b"anything.example"))


@pytest.mark.parametrize(
    ("headers", "ok"),
    [
        ([(b"content-type", b"application/json")], True),
        ([(b"content-type", b"application/json; charset=utf-8"), (b"origin", b"https://x")], True),
        ([(b"content-type", b"application/vnd.api+json")], True),
        ([], True),  # curl or a script: no browser, no Origin
        ([(b"origin", b"https://evil.example")], False),  # a browser's Blob body without a type
        ([(b"content-type", b"text/plain;charset=UTF-8")], False),
        ([(b"content-type", b"application/x-www-form-urlencoded")], False),
        ([(b"content-type", b"multipart/form-data; boundary=x")], False),
    ],
)
def test_json_only(headers, ok):
    assert is_json_request(scope(*headers)) is ok
