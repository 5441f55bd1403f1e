"""One `/ng-rollout/<id>/` conversation run twice, by two server runs, into one capture directory.

Before records carried their server run, the second run's calls merged into the first run's session
and the chain broke where the second run began: a whole rollout turned partial with `mask_sample`
on, and nothing said so. Now the default rollout covers the latest run, `?run=all` still shows the
merge (the negative control), the listing names both runs, and the second run warns once.
"""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
from openai import OpenAI

from tests.support.stack import launch_stack

ROLLOUT_ID = "task7-r0-a0"
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def _agent_episode(url: str, ask: str) -> None:
    """A Gym-style agent: a tool call, the tool's answer, the final reply, all under one rollout prefix."""
    client = OpenAI(base_url=f"{url}/ng-rollout/{ROLLOUT_ID}/v1", api_key="unused", max_retries=0)
    first = client.responses.create(
        model="demo", input=[{"role": "user", "content": ask}], tools=[WEATHER_TOOL], store=False
    )
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls, first.output
    history = [{"role": "user", "content": ask}, *[item.model_dump(exclude_none=True) for item in first.output]]
    history.append(
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": json.dumps({"forecast": "sunny"})}
    )
    second = client.responses.create(model="demo", input=history, tools=[WEATHER_TOOL], store=False)
    assert second.output_text


def _cli(*args: str) -> dict:
    """`switchyard-model sessions ...` as a user runs it; its JSON output."""
    out = subprocess.run(
        [sys.executable, "-m", "server.cli", "sessions", *args], capture_output=True, check=True, timeout=120
    )
    return json.loads(out.stdout)


def _get(url: str, path: str, **params: str) -> httpx.Response:
    return httpx.get(url + path, params=params, timeout=30)


def test_a_session_id_used_again_by_a_later_run_keeps_each_runs_rollout_whole(mock_upstream, tmp_path):
    capture_dir = tmp_path / "captures"
    rollout_path = f"/v1/sessions/{ROLLOUT_ID}/rollout"

    first = launch_stack(mock_upstream, capture_dir)
    try:
        _agent_episode(first.url, 'Weather in Paris? [[mock:tool get_weather {"city": "Paris"}]]')
        first_health = _get(first.url, "/health").json()["capture"]
        before = _get(first.url, rollout_path).json()
        assert before["mask_sample"] is False and before["partial_reason"] is None
    finally:
        first.proc.stop()

    second = launch_stack(mock_upstream, capture_dir)
    try:
        # The same task again. A model samples it anew; the mock answers identical input identically
        # (its records would then read as retries of the first run's), so the script varies the call.
        _agent_episode(second.url, 'Weather in Paris? [[mock:tool get_weather {"city": "Lyon"}]]')
        # What went wrong before runs were recorded: this rollout came back partial, masked.
        latest = _get(second.url, rollout_path).json()
        assert latest["mask_sample"] is False and latest["partial_reason"] is None
        assert len(latest["record_uuids"]) == 2

        first_run = first_health["server_run"]
        second_run = _get(second.url, "/health").json()["capture"]["server_run"]
        assert second_run != first_run
        (listed,) = _get(second.url, "/v1/sessions").json()["sessions"]
        assert listed["session_id"] == ROLLOUT_ID and listed["record_count"] == 4
        assert listed["runs"] == [first_run, second_run]
        records = _get(second.url, f"/v1/sessions/{ROLLOUT_ID}/completions").json()["completions"]
        by_uuid = {r["uuid"]: r for r in records}
        assert {by_uuid[u]["server_run"] for u in latest["record_uuids"]} == {second_run}

        # The first run's rollout is still there, whole and the same as before the second run.
        earlier = _get(second.url, rollout_path, run=first_run).json()
        assert earlier["record_uuids"] == before["record_uuids"] and earlier["mask_sample"] is False
        assert earlier["output"] == before["output"]

        # Negative control: merging both runs (`run=all`) gives a rollout masked as broken.
        merged = _get(second.url, rollout_path, run="all").json()
        assert merged["mask_sample"] is True and merged["partial_reason"] is not None

        bad = _get(second.url, rollout_path, run="not a run")
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "run"

        # The CLI over HTTP and on the directory agree, run by run.
        for run, masked in (((), False), (("--run", "all"), True), (("--run", first_run), False)):
            over_http = _cli("rollout", ROLLOUT_ID, "--url", second.url, *run)
            assert over_http == _cli("rollout", ROLLOUT_ID, "--capture-dir", str(capture_dir), *run)
            assert over_http["mask_sample"] is masked, run
    finally:
        second.proc.stop()

    warnings = [line for line in second.proc.output().splitlines() if "earlier server run" in line]
    assert len(warnings) == 1, warnings
    assert ROLLOUT_ID in warnings[0] and first_run in warnings[0] and second_run in warnings[0]
    assert "earlier server run" not in first.proc.output()
