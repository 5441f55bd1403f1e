"""Helpers for the real-agent-client tests: find the npm-installed clients, run them headless, check rollouts."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

CLIENTS_DIR = Path(__file__).resolve().parents[1] / "clients"
NODE_MODULES = CLIENTS_DIR / "node_modules"
# Generous: a client run takes seconds, but a loaded CI machine can be slow to start a 180 MB binary.
CLIENT_TIMEOUT_S = 180.0


def installed(package: str) -> bool:
    """Whether `npm install` in tests/clients put `package` into node_modules."""
    return (NODE_MODULES / package / "package.json").is_file()


def not_installed_reason(package: str) -> str:
    return f"{package} is not installed in {NODE_MODULES} (run `make node` or `cd tests/clients && npm install`)"


def codex_argv() -> list[str]:
    """The Codex CLI entry point, run by the node on PATH (as the npm `codex` shim would)."""
    node = shutil.which("node")
    if node is None:
        raise AssertionError("@openai/codex is installed but `node` is not on PATH")
    return [node, str(NODE_MODULES / "@openai" / "codex" / "bin" / "codex.js")]


def opencode_binary() -> Path:
    """opencode's native binary.

    opencode-ai's postinstall copies the platform binary over its `bin/opencode.exe`
    placeholder (a shell script that prints an error). When an npm that blocks install
    scripts skipped it, the binary is still there in the platform package (an optional
    dependency from the npm registry), so take it from there.
    """
    shim = NODE_MODULES / "opencode-ai" / "bin" / "opencode.exe"
    candidates = [shim] + sorted(NODE_MODULES.glob("opencode-*/bin/opencode"))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK) and _is_native(path):
            return path
    raise AssertionError(f"opencode-ai is installed but no native opencode binary was found among {candidates}")


def _is_native(path: Path) -> bool:
    with open(path, "rb") as handle:
        magic = handle.read(4)
    # ELF, Mach-O (both byte orders, 32/64) or a Windows PE.
    return magic in {b"\x7fELF", b"\xcf\xfa\xed\xfe", b"\xce\xfa\xed\xfe", b"\xfe\xed\xfa\xcf"} or magic[:2] == b"MZ"


def client_env(home: Path, **extra: str) -> dict[str, str]:
    """A minimal environment: nothing from the developer's own config, keys or proxies leaks in."""
    dirs = {
        "HOME": home,
        "XDG_CONFIG_HOME": home / ".config",
        "XDG_DATA_HOME": home / ".local" / "share",
        "XDG_CACHE_HOME": home / ".cache",
        "XDG_STATE_HOME": home / ".local" / "state",
    }
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    env = {name: str(path) for name, path in dirs.items()}
    env.update(
        {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
        }
    )
    env.update(extra)
    return env


@dataclass
class ClientRun:
    """What one headless client invocation did."""

    argv: list[str]
    returncode: int | None  # None: killed after the timeout
    stdout: str
    stderr: str
    seconds: float

    def events(self) -> list[dict]:
        """The JSON-lines events on stdout (any other line is skipped)."""
        out = []
        for line in self.stdout.splitlines():
            line = line.strip()
            if line.startswith("{"):
                try:
                    out.append(orjson.loads(line))
                except orjson.JSONDecodeError:
                    pass
        return out

    def describe(self, server_log: str = "") -> str:
        """Everything needed to debug a failed run, for an assertion message."""
        status = "timed out" if self.returncode is None else f"exit code {self.returncode}"
        parts = [
            f"client {status} after {self.seconds:.1f}s: {self.argv[-1][:200]!r}",
            "---- stdout (tail) ----",
            self.stdout[-6000:],
            "---- stderr (tail) ----",
            self.stderr[-6000:],
        ]
        if server_log:
            parts += ["---- server log (tail) ----", server_log[-6000:]]
        return "\n".join(parts)


def run_client(argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float = CLIENT_TIMEOUT_S) -> ClientRun:
    """Run a client with stdin closed, in its own process group, killing the whole group when done.

    Output goes to files, not pipes: a grandchild (a shell the agent started) that keeps a pipe
    open would otherwise hang the read after the client itself exited.
    """
    started = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            argv, cwd=str(cwd), env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True
        )
        try:
            returncode: int | None = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            returncode = None
        finally:
            # The client's process group: the client and anything it left running (sub-agents, shells).
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(10)
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode("utf-8", "replace")
        stderr = err.read().decode("utf-8", "replace")
    return ClientRun(argv, returncode, stdout, stderr, time.monotonic() - started)


def get_json(url: str, **params: Any) -> Any:
    response = httpx.get(url, params=params or None, timeout=60)
    assert response.status_code == 200, f"GET {url}: {response.status_code} {response.text[:2000]}"
    return response.json()


def assert_token_exact(chain: Any, rollout: dict) -> None:
    """The rollout's generated items carry, in order, exactly the token ids the mock upstream generated.

    Three sources must agree per call: the output item, the capture record it came from, and a
    fresh non-streaming replay of the very request the upstream received (the mock is
    deterministic, so the replay regenerates the same ids). The upstream request is found by the
    `x-request-id` this server forwards, which is also the record's `request_id`.
    """
    session_id = rollout["session_id"]
    records = {r["uuid"]: r for r in get_json(f"{chain.v1}/sessions/{session_id}/completions")["completions"]}
    used = [records[uuid] for uuid in rollout["record_uuids"]]
    assert used, f"rollout {session_id} used no records"
    generated = [item for item in rollout["output"] if "generation_token_ids" in item]
    assert [item["generation_token_ids"] for item in generated] == [r["generation_token_ids"] for r in used]
    assert [item["prompt_token_ids"] for item in generated] == [r["prompt_token_ids"] for r in used]
    assert [item["generation_log_probs"] for item in generated] == [r["generation_log_probs"] for r in used]

    upstream = {entry["headers"].get("x-request-id"): entry for entry in chain.mock_requests()}
    for record in used:
        entry = upstream.get(record["request_id"])
        assert entry is not None, f"no upstream request with x-request-id {record['request_id']!r}"
        body = dict(entry["body"])
        body.pop("stream", None)
        body.pop("stream_options", None)
        body.update(return_token_ids=True, logprobs=True, top_logprobs=0)
        replay = httpx.post(chain.upstream_url + "/v1/chat/completions", json=body, timeout=60)
        assert replay.status_code == 200, replay.text[:2000]
        reply = replay.json()
        assert reply["choices"][0]["token_ids"] == record["generation_token_ids"], (
            f"record {record['uuid']}: generated ids differ from what the upstream generates for its request"
        )
        assert reply["prompt_token_ids"] == record["prompt_token_ids"], (
            f"record {record['uuid']}: prompt ids differ from the upstream's"
        )
