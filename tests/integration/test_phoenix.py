"""The demo stack's traces as Arize Phoenix shows them: read back through Phoenix's own GraphQL API.

Phoenix (from `make phoenix`'s venv) runs offline on loopback ports; the chain exports to it as
docs/observability.md says. What a user sees first must be right: per-session token totals, each
session's first input and last output, the envelope not taken for a model call, the tool
definitions, the failing call red, and no exporter errors in the server's log.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.support.phoenix import PHOENIX_PYTHON, Phoenix, listening_addresses, start_phoenix
from tests.support.procs import wait_for
from tests.support.stack import Stack, launch_stack

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
# Switchyard's INFO spans kept, its per-request log lines not (the demo's setting).
QUIET_RUST_LOG = "warn,switchyard_server=info,switchyard_server::request=warn,libsy=info"

_PROJECT_QUERY = """
query {
  projects { edges { node {
    name
    sessions(first: 50) { edges { node {
      sessionId
      tokenUsage { prompt completion }
      firstInput { value mimeType }
      lastOutput { value mimeType }
    } } }
    spans(first: 1000) { edges { node {
      name spanKind statusCode statusMessage parentId attributes
    } } }
  } } }
}
"""


@pytest.fixture(scope="module")
def phoenix():
    if not PHOENIX_PYTHON.exists():
        pytest.skip("Phoenix is not installed: run `make phoenix` (`make test` does)")
    server = start_phoenix()
    print(f"Phoenix started in {server.started_in_s:.1f}s")
    yield server
    server.proc.stop()


def test_phoenix_listens_on_loopback_only(phoenix):
    port = int(phoenix.url.rsplit(":", 1)[1])
    assert listening_addresses(port) == {"127.0.0.1"}
    assert listening_addresses(phoenix.grpc_port) == {"127.0.0.1"}


def _launch(phoenix: Phoenix, mock_upstream: str, tmp_path, project: str, capture_content: bool) -> Stack:
    config = tmp_path / f"{project}.yaml"
    config.write_text(f"otel_capture_content: {str(capture_content).lower()}\notel_traces_per_s: 0\n")
    env = {
        # As docs/observability.md says for Phoenix: its root URL; the project by a resource attribute.
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": phoenix.url + "/v1/traces",
        "OTEL_RESOURCE_ATTRIBUTES": f"openinference.project.name={project}",
        "RUST_LOG": QUIET_RUST_LOG,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_METRIC_EXPORT_INTERVAL": "500",  # several metric exports while the test runs
        # Whatever the runner's environment says, these are the defaults.
        "OTEL_SDK_DISABLED": "false",
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_METRICS_EXPORTER": "otlp",
        "OTEL_SERVICE_NAME": "switchyard-model",
    }
    return launch_stack(mock_upstream, tmp_path / f"cap-{project}", "--config", str(config), env=env)


def _engine_tokens(chain: Stack, since: int) -> tuple[int, int]:
    calls = chain.engine_calls(after=since)
    return sum(len(c["prompt_token_ids"]) for c in calls), sum(len(c["generation_token_ids"]) for c in calls)


def _drive(chain: Stack, run: str) -> dict[str, tuple[int, int]]:
    """Chat, a stream, Responses with a tool, a failure; sessions `{run}-alpha`, `-beta`, `-failing`.
    Returns each session's engine tokens. (Phoenix keys sessions by id across projects: each run
    needs its own ids.)"""
    client = httpx.Client(base_url=chain.v1, timeout=60)
    tokens = {}
    before = chain.engine_mark()
    alpha = {"x-session-id": f"{run}-alpha"}
    reply = client.post(
        "/chat/completions",
        headers=alpha,
        json={"model": "demo", "messages": [{"role": "user", "content": "Hello alpha [[mock:say Alpha one.]]"}]},
    )
    assert reply.status_code == 200, reply.text
    streamed = client.post(
        "/chat/completions",
        headers=alpha,
        json={
            "model": "demo",
            "stream": True,
            "messages": [{"role": "user", "content": "Again alpha [[mock:say Alpha two, streamed.]]"}],
        },
    )
    assert streamed.status_code == 200 and "[DONE]" in streamed.text
    tokens[f"{run}-alpha"] = _engine_tokens(chain, before)

    before = chain.engine_mark()
    beta = {"x-session-id": f"{run}-beta"}
    history: list = [{"role": "user", "content": 'Weather in Paris? [[mock:tool get_weather {"city": "Paris"}]]'}]
    first = client.post("/responses", headers=beta, json={"model": "demo", "input": history, "tools": [WEATHER]})
    assert first.status_code == 200, first.text
    call = next(item for item in first.json()["output"] if item["type"] == "function_call")
    history += first.json()["output"]
    history.append({"type": "function_call_output", "call_id": call["call_id"], "output": "sunny, 21C"})
    second = client.post(
        "/responses", headers=beta, json={"model": "demo", "input": history, "tools": [WEATHER], "stream": True}
    )
    assert second.status_code == 200 and "response.completed" in second.text
    tokens[f"{run}-beta"] = _engine_tokens(chain, before)

    failed = client.post(
        "/chat/completions",
        headers={"x-session-id": f"{run}-failing"},
        json={"model": "demo", "messages": [{"role": "user", "content": "Break [[mock:error 500]]"}]},
    )
    assert failed.status_code >= 500
    return tokens


def _read_project(phoenix: Phoenix, project: str, want_spans: int) -> dict:
    """The project once it has at least `want_spans` spans and no more arrived for a second."""
    seen: dict = {"count": -1}

    def settled() -> bool:
        projects = {e["node"]["name"]: e["node"] for e in phoenix.graphql(_PROJECT_QUERY)["projects"]["edges"]}
        found = projects.get(project)
        count = len(found["spans"]["edges"]) if found else 0
        done = count >= want_spans and count == seen["count"]
        seen.update(count=count, found=found, projects=projects)
        return done

    wait_for(settled, 60, interval=1.0)
    assert seen["found"], sorted(seen["projects"])
    return seen["found"]


def _spans(project: dict) -> list[dict]:
    out = []
    for edge in project["spans"]["edges"]:
        span = dict(edge["node"])
        span["attributes"] = (
            json.loads(span["attributes"]) if isinstance(span["attributes"], str) else span["attributes"]
        )
        out.append(span)
    return out


def _flat(attributes: dict, prefix: str = "") -> dict:
    """Phoenix returns attributes nested ({"llm": {"tools": [{"tool": ...}]}}); flatten to dotted keys."""
    out = {}
    items = enumerate(attributes) if isinstance(attributes, list) else attributes.items()
    for key, value in items:
        if isinstance(value, dict) or (isinstance(value, list) and value and all(isinstance(v, dict) for v in value)):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _exporter_complaints(log: str) -> list[str]:
    return [
        line
        for line in log.splitlines()
        if ("opentelemetry" in line.lower() or "export" in line.lower() or "otlp" in line.lower())
        and ("error" in line.lower() or "warn" in line.lower() or "fail" in line.lower())
    ]


@pytest.mark.parametrize("capture_content", [True, False], ids=["content", "no-content"])
def test_phoenix_reads_the_chains_traces_right(phoenix, mock_upstream, tmp_path, capture_content):
    project = f"switchyard-{'content' if capture_content else 'plain'}"
    chain = _launch(phoenix, mock_upstream, tmp_path, project, capture_content)
    try:
        tokens = _drive(chain, project)
        time.sleep(2)  # a few metric export intervals: a traces-only endpoint must not produce errors
    finally:
        chain.proc.stop()  # flushes our exporter and closes Switchyard (which flushes its own)
    log = chain.proc.output()
    # 5 calls: our 2 spans each, and Switchyard's 3 for each of the 4 that reached the model.
    found = _read_project(phoenix, project, want_spans=5 * 2 + 4 * 3)
    spans = _spans(found)
    sessions = {e["node"]["sessionId"].removeprefix(project + "-"): e["node"] for e in found["sessions"]["edges"]}
    assert set(sessions) == {"alpha", "beta", "failing"}, sorted(sessions)

    # Usage counted once per call: the session's totals are the engine's counts, not twice them.
    for session_id, (prompt, completion) in tokens.items():
        usage = sessions[session_id.removeprefix(project + "-")]["tokenUsage"]
        assert (usage["prompt"], usage["completion"]) == (prompt, completion), (session_id, usage)

    # The envelope (our SERVER span, the trace's root) is a CHAIN; only model calls are LLM spans.
    roots = [s for s in spans if s["parentId"] is None]
    assert len(roots) == 5
    assert {s["spanKind"].upper() for s in roots} == {"CHAIN"}, [(s["name"], s["spanKind"]) for s in roots]
    assert {s["name"] for s in roots} == {"POST /v1/chat/completions", "POST /v1/responses"}
    llm = [s for s in spans if s["spanKind"].upper() == "LLM"]
    assert all(not s["name"].startswith("POST ") for s in llm)
    ok_roots = [s for s in roots if s["statusCode"] == "OK"]
    assert len(ok_roots) == 4

    # The model that answered is the model shown on our model-call spans (not the route, `demo`).
    ours = [s for s in llm if _flat(s["attributes"]).get("switchyard_model.route")]
    answered = [s for s in ours if s["statusCode"] == "OK"]
    assert len(answered) == 4 and {_flat(s["attributes"])["llm.model_name"] for s in answered} == {"mock-model"}

    # The failing call is an error, with the upstream's message.
    failing = [s for s in roots if s["statusCode"] == "ERROR"]
    assert len(failing) == 1 and failing[0]["statusMessage"]

    if capture_content:
        # Each session's first input is what the user sent, and its last output the model's text.
        assert "Hello alpha" in sessions["alpha"]["firstInput"]["value"]
        assert sessions["alpha"]["lastOutput"]["value"] == "Alpha two, streamed."
        # The input is the body as the client sent it, without what this server adds upstream.
        (streamed,) = [s for s in roots if "Again alpha" in _flat(s["attributes"]).get("input.value", "")]
        assert "stream_options" not in json.loads(_flat(streamed["attributes"])["input.value"])
        beta_input = json.loads(sessions["beta"]["firstInput"]["value"])
        assert beta_input["input"][0]["content"].startswith("Weather in Paris?")  # the Responses request
        assert "sunny, 21C" in sessions["beta"]["lastOutput"]["value"]
        # The tool definitions are listed (Phoenix drops the whole list if one is malformed).
        tools = [
            value
            for s in ours
            for key, value in _flat(s["attributes"]).items()
            if key.startswith("llm.tools.") and key.endswith("json_schema")
        ]
        assert tools and all("get_weather" in json.dumps(t) for t in tools), tools
    else:
        for session in sessions.values():
            assert session["firstInput"] is None and session["lastOutput"] is None
        assert "Hello alpha" not in json.dumps([s["attributes"] for s in spans])

    assert _exporter_complaints(log) == [], log[-3000:]
