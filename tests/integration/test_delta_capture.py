"""Delta-encoded capture through the real chain: the same agent session on a server writing whole
records and on one writing deltas is served the same, by the API and by the offline CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import orjson
import yaml
from openai import OpenAI

from server.capture.read.diff_read import parse_diff_file
from server.capture.store import session_dir_name
from server.capture.write.diff import DIFF_SUFFIX
from tests.support.stack import launch_stack

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
# Fields that differ between two servers answering the same calls.
PER_SERVER = ("uuid", "captured_at", "latency_ms", "server_run", "request_id", "response_id")


def agent_session(base_url: str, session_id: str, turns: int) -> None:
    """A tool-using agent over the openai SDK: tool turns and plain turns, streamed and not."""
    client = OpenAI(base_url=base_url, api_key="x", http_client=httpx.Client(timeout=60))
    headers = {"x-session-id": session_id}
    messages: list[dict] = [{"role": "system", "content": "You are a weather agent. " * 30}]
    for turn in range(turns):
        city = ["Paris", "Oslo", "Lima"][turn % 3]
        ask = f"Turn {turn}: weather in {city}?"
        if turn % 2 == 0:
            ask += f' [[mock:tool get_weather {{"city": "{city}"}}]]'
        messages.append({"role": "user", "content": ask + " [[mock:tokens 30]]"})
        if turn % 3 == 1:
            stream = client.chat.completions.create(
                model="demo", messages=messages, tools=TOOLS, stream=True, extra_headers=headers
            )
            text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
            messages.append({"role": "assistant", "content": text})
            continue
        reply = client.chat.completions.create(model="demo", messages=messages, tools=TOOLS, extra_headers=headers)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps({"sunny": True})})


def settings(tmp_path, name: str, **values) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


def normalised(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in record.items() if k not in PER_SERVER} for record in records]


def without_ids(rollout: dict, records: list[dict]) -> bytes:
    """The rollout's bytes with each record's per-server ids (item ids are made from them) numbered instead."""
    text = orjson.dumps({k: v for k, v in rollout.items() if k != "server_run"}).decode()
    for i, record in enumerate(records):
        for field in PER_SERVER:
            value = record.get(field)
            if isinstance(value, str) and len(value) > 8:
                text = text.replace(value, f"<{field} {i}>")
    return text.encode()


def test_a_delta_server_serves_what_a_full_server_serves(mock_upstream, tmp_path):
    served: dict[str, dict] = {}
    for encoding in ("full", "delta"):
        capture_dir = tmp_path / encoding
        config = settings(tmp_path, encoding, capture_encoding=encoding)
        stack = launch_stack(mock_upstream, capture_dir, "--config", config)
        try:
            agent_session(stack.v1, "weather-agent", turns=9)
            completions = httpx.get(f"{stack.v1}/sessions/weather-agent/completions", timeout=30)
            rollout = httpx.get(f"{stack.v1}/sessions/weather-agent/rollout", timeout=60)
            assert completions.status_code == rollout.status_code == 200
            served[encoding] = {"completions": completions.json(), "rollout": rollout.json(), "dir": capture_dir}
        finally:
            stack.proc.stop()

    full, delta = served["full"], served["delta"]
    full_records, delta_records = full["completions"]["completions"], delta["completions"]["completions"]
    assert len(delta_records) == len(full_records) == 9
    assert delta["completions"]["skipped"] == 0
    assert all(record["is_valid"] for record in delta_records)
    # The token ids, log probs, messages and tools of every call are the same on both servers.
    assert normalised(delta_records) == normalised(full_records)
    assert without_ids(delta["rollout"], delta_records) == without_ids(full["rollout"], full_records)
    # (The mock re-tokenises a streamed reply differently, so both rollouts stop at the same turn.)
    assert len(delta["rollout"]["record_uuids"]) >= 4

    # On disk: deltas, each but the first built on the call before, and far smaller than whole records.
    directory = delta["dir"] / "sessions" / session_dir_name("weather-agent")
    files = sorted(directory.glob(f"*{DIFF_SUFFIX}"))
    assert len(files) == 9 and not list(directory.glob("*.json"))
    based = [parse_diff_file(path.read_bytes()).meta["base"] for path in files]
    assert based.count(None) == 1
    full_dir = full["dir"] / "sessions" / session_dir_name("weather-agent")
    delta_bytes = sum(path.stat().st_size for path in files)
    full_bytes = sum(path.stat().st_size for path in full_dir.glob("*.json"))
    assert delta_bytes < full_bytes / 2

    # The offline CLI reads the delta directory into exactly what the server served.
    shown = subprocess.run(
        [sys.executable, "-m", "server.cli", "sessions", "show", "weather-agent", "--capture-dir", str(delta["dir"])],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["completions"] == delta_records
