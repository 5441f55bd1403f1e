"""The running stack for integration tests: mock upstream → hosted Switchyard → this server, on loopback."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import httpx

from tests.support.procs import Proc, start_server, wait_for


@dataclass
class Stack:
    url: str  # this server's root
    proc: Proc
    capture_dir: Path
    upstream_url: str  # the mock upstream's root

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    def mock_requests(self) -> list[dict]:
        return httpx.get(self.upstream_url + "/mock/requests").json()["requests"]

    def mock_stats(self) -> dict:
        return httpx.get(self.upstream_url + "/mock/stats").json()

    def records(self, session_id: str, wait_s: float = 0.0) -> list[dict]:
        """The session's captured records as `GET /v1/sessions/{id}/completions` lists them.

        `wait_s`: how long to keep asking while the session is not there yet (its first record may
        still be on its way to disk after a stream's last byte)."""
        url = f"{self.v1}/sessions/{quote(session_id, safe='')}/completions"
        replies: list[httpx.Response] = []

        def answered() -> bool:
            replies.append(httpx.get(url, timeout=30))
            return replies[-1].status_code == 200

        wait_for(answered, wait_s, interval=0.1)
        reply = replies[-1]
        assert reply.status_code == 200, reply.text
        return reply.json()["completions"]

    def engine_calls(self, after: int = 0) -> list[dict]:
        """The chat calls the mock served, in order, with the prompt and generated ids it used; only
        those after the request numbered `after` (see `engine_mark`)."""
        return [
            e
            for e in self.mock_requests()
            if e["seq"] > after and e["path"] == "/v1/chat/completions" and "prompt_token_ids" in e
        ]

    def engine_mark(self) -> int:
        """The number of the mock's latest request: `engine_calls(after=mark)` is what came since. (The
        mock keeps only its last 200 requests, so counting entries breaks on a busy shared stack.)"""
        requests = self.mock_requests()
        return requests[-1]["seq"] if requests else 0


def token_breaks(calls: list[dict]) -> list[int]:
    """Indices of the engine calls whose prompt does not extend the previous call's prompt + generation."""
    out = []
    for i in range(1, len(calls)):
        before = calls[i - 1]["prompt_token_ids"] + calls[i - 1]["generation_token_ids"]
        if calls[i]["prompt_token_ids"][: len(before)] != before:
            out.append(i)
    return out


def launch_stack(upstream_url: str, capture_dir: Path, *extra: str, env: dict[str, str] | None = None) -> Stack:
    """`switchyard-model serve` on the demo deployment, its route pointed at the mock upstream."""
    proc, url = start_server(
        "--deployment",
        "demo",
        "--capture-dir",
        str(capture_dir),
        *extra,
        env={"MOCK_UPSTREAM_URL": upstream_url + "/v1", **(env or {})},
    )
    return Stack(url, proc, capture_dir, upstream_url)
