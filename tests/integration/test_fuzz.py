"""Fuzzing: hypothesis bodies against the real chain and the translator, schemathesis against docs/openapi.yaml."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.api.chat import validate_chat
from server.errors import OpenAIError
from server.translate.request import ChatRequest, responses_to_chat
from tests.support.model_paths import model_paths

OPENAPI = Path(__file__).resolve().parents[2] / "docs" / "openapi.yaml"
# Examples per fuzz test are multiplied by this (e.g. SWITCHYARD_FUZZ_SCALE=20 for a long hunt).
SCALE = float(os.environ.get("SWITCHYARD_FUZZ_SCALE", "1"))

# 5xx a healthy server may still answer, because the cause is upstream of it: 502 (the upstream is
# unreachable, cut the connection, or answered something that is not a chat completion), 503 (Switchyard
# is not running) and 504 (the upstream timed out). A 500 is either this server's own crash (code
# internal_error) or a relayed upstream crash; with the mock as the upstream both are bugs in this repo.
# A translation bug that makes the upstream refuse a body we accepted comes back as a relayed 4xx: fine.
UPSTREAM_CAUSED = frozenset({502, 503, 504})


# ---- strategies -------------------------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
text = st.text(max_size=40)
names = st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True)


def sometimes_garbage(valid: st.SearchStrategy) -> st.SearchStrategy:
    """Mostly the valid shape, now and then any JSON value in its place (rare enough that whole bodies
    often come out valid and go all the way upstream and back)."""
    return st.sampled_from(range(8)).flatmap(lambda pick: json_values if pick == 7 else valid)


text_part = st.fixed_dictionaries({"type": st.sampled_from(["input_text", "output_text", "text"]), "text": text})
content_part = sometimes_garbage(
    st.one_of(
        text_part,
        text_part,
        text_part,
        st.fixed_dictionaries({"type": st.just("input_image"), "image_url": st.just("data:image/png;base64,AAAA")}),
        st.fixed_dictionaries({"type": st.just("refusal"), "refusal": text}),
        st.fixed_dictionaries({"type": st.sampled_from(["input_file", "input_audio", "bogus"])}),
    )
)
content = st.one_of(text, st.lists(content_part, max_size=3))
input_item = sometimes_garbage(
    st.one_of(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "system", "developer", "assistant"]), "content": content}
        ),
        st.fixed_dictionaries(
            {
                "type": st.just("message"),
                "role": sometimes_garbage(st.sampled_from(["user", "assistant"])),
                "content": content,
            }
        ),
        st.fixed_dictionaries(
            {
                "type": st.just("function_call"),
                "call_id": sometimes_garbage(names),
                "name": sometimes_garbage(names),
                "arguments": sometimes_garbage(st.just("{}")),
            },
            optional={"namespace": sometimes_garbage(names)},
        ),
        st.fixed_dictionaries(
            {
                "type": st.just("function_call_output"),
                "call_id": sometimes_garbage(names),
                "output": sometimes_garbage(content),
            }
        ),
        st.fixed_dictionaries(
            {
                "type": st.just("custom_tool_call"),
                "call_id": sometimes_garbage(names),
                "name": sometimes_garbage(names),
                "input": sometimes_garbage(text),
            }
        ),
        st.fixed_dictionaries(
            {
                "type": st.just("custom_tool_call_output"),
                "call_id": sometimes_garbage(names),
                "output": sometimes_garbage(content),
            }
        ),
        st.fixed_dictionaries(
            {"type": st.just("reasoning")},
            optional={
                "summary": st.lists(content_part, max_size=2),
                "content": st.lists(content_part, max_size=2),
                "encrypted_content": text,
            },
        ),
    )
)
function_tool = st.fixed_dictionaries(
    {"type": st.just("function"), "name": sometimes_garbage(names)},
    optional={
        "description": sometimes_garbage(text),
        "strict": sometimes_garbage(st.booleans()),
        "parameters": sometimes_garbage(st.just({"type": "object", "properties": {"x": {"type": "string"}}})),
    },
)
tool = sometimes_garbage(
    st.one_of(
        function_tool,
        st.fixed_dictionaries(
            {
                "type": st.just("namespace"),
                "name": sometimes_garbage(names),
                "tools": sometimes_garbage(st.lists(function_tool, max_size=2)),
            }
        ),
        st.fixed_dictionaries(
            {"type": st.just("custom"), "name": sometimes_garbage(names)},
            optional={
                "description": sometimes_garbage(text),
                "format": sometimes_garbage(
                    st.sampled_from(
                        [
                            {"type": "text"},
                            {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"},
                            {"type": "grammar", "syntax": "regex", "definition": "[a-z]+"},
                        ]
                    )
                ),
            },
        ),
        st.fixed_dictionaries({"type": st.sampled_from(["web_search", "local_shell"])}),
    )
)
tool_choice = sometimes_garbage(
    st.one_of(
        st.sampled_from(["auto", "none", "required"]),
        st.fixed_dictionaries({"type": st.just("function"), "name": names}, optional={"namespace": names}),
        st.fixed_dictionaries(
            {
                "type": st.just("allowed_tools"),
                "mode": st.sampled_from(["auto", "required", "x"]),
                "tools": st.lists(st.fixed_dictionaries({"type": st.just("function"), "name": names}), max_size=2),
            }
        ),
    )
)
text_config = sometimes_garbage(
    st.fixed_dictionaries(
        {},
        optional={
            "format": sometimes_garbage(
                st.one_of(
                    st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object"])}),
                    st.fixed_dictionaries(
                        {
                            "type": st.just("json_schema"),
                            "name": names,
                            "schema": sometimes_garbage(st.just({"type": "object"})),
                        }
                    ),
                )
            )
        },
    )
)

# Every field a Responses body may carry, each mostly well-typed.
RESPONSES_FIELDS = {
    "model": sometimes_garbage(st.just("x")),
    "instructions": sometimes_garbage(text),
    "tools": sometimes_garbage(st.lists(tool, max_size=3)),
    "tool_choice": tool_choice,
    "parallel_tool_calls": sometimes_garbage(st.booleans()),
    "max_output_tokens": sometimes_garbage(st.integers(min_value=1, max_value=64)),
    "temperature": sometimes_garbage(st.floats(min_value=0, max_value=2)),
    "top_p": sometimes_garbage(st.floats(min_value=0, max_value=1)),
    "top_logprobs": sometimes_garbage(st.integers(min_value=0, max_value=20)),
    "text": text_config,
    "reasoning": sometimes_garbage(st.fixed_dictionaries({}, optional={"effort": st.sampled_from(["low", "high"])})),
    "metadata": sometimes_garbage(st.dictionaries(names, text, max_size=2)),
    "user": sometimes_garbage(text),
    "stream": sometimes_garbage(st.booleans()),
    "store": json_values,
    "include": sometimes_garbage(
        st.lists(st.sampled_from(["message.output_text.logprobs", "reasoning.x"]), max_size=2)
    ),
    "previous_response_id": sometimes_garbage(st.none()),
    "background": sometimes_garbage(st.just(False)),
    "truncation": json_values,
    "seed": sometimes_garbage(st.integers(min_value=0, max_value=2**31)),
    "stop": sometimes_garbage(st.lists(text, max_size=2)),
    "proxy_x_session_id": sometimes_garbage(names),
    "return_token_id_information": sometimes_garbage(st.booleans()),
}
responses_bodies = st.builds(
    lambda base, extra: {**base, **extra},
    st.fixed_dictionaries(
        {"input": sometimes_garbage(st.one_of(text, st.lists(input_item, max_size=4)))}, optional=RESPONSES_FIELDS
    ),
    # Unknown fields now and then, which /v1/responses must refuse by name.
    st.one_of(st.dictionaries(names, json_values, max_size=1), *[st.just({})] * 5),
)

chat_message = sometimes_garbage(
    st.fixed_dictionaries(
        {
            "role": sometimes_garbage(st.sampled_from(["user", "system", "assistant", "tool", "developer"])),
            "content": sometimes_garbage(
                st.one_of(text, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text}), max_size=2))
            ),
        },
        optional={"tool_call_id": names, "name": names},
    )
)
CHAT_FIELDS = {
    "model": sometimes_garbage(st.just("x")),
    "stream": sometimes_garbage(st.booleans()),
    "max_tokens": sometimes_garbage(st.integers(min_value=0, max_value=64)),
    "max_completion_tokens": sometimes_garbage(st.integers(min_value=0, max_value=64)),
    "n": sometimes_garbage(st.just(1)),
    "temperature": sometimes_garbage(st.floats(min_value=0, max_value=2)),
    "tools": sometimes_garbage(
        st.lists(
            st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries({"name": names})}),
            max_size=2,
        )
    ),
    "logprobs": sometimes_garbage(st.booleans()),
    "top_logprobs": sometimes_garbage(st.integers(min_value=0, max_value=20)),
    "return_token_ids": sometimes_garbage(st.booleans()),
    "stream_options": sometimes_garbage(st.fixed_dictionaries({"include_usage": st.booleans()})),
    "proxy_x_session_id": sometimes_garbage(names),
}
chat_bodies = st.builds(
    lambda base, extra: {**base, **extra},
    st.fixed_dictionaries(
        {"messages": sometimes_garbage(st.lists(chat_message, min_size=1, max_size=4))}, optional=CHAT_FIELDS
    ),
    st.one_of(st.dictionaries(names, json_values, max_size=1), *[st.just({})] * 5),
)

# ---- the property, over HTTP -----------------------------------------------------------------------


def check_reply(response: httpx.Response, endpoint: str) -> None:
    """Never a 5xx of our own; errors in the OpenAI shape; successes in the endpoint's shape."""
    status = response.status_code
    assert status < 500 or status in UPSTREAM_CAUSED, (status, response.text[:500])
    media = response.headers.get("content-type", "")
    if status >= 400:
        assert media.startswith("application/json"), media
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, error
        assert isinstance(error["message"], str) and error["message"]
        assert error["param"] is None or isinstance(error["param"], str)
        return
    assert status == 200, status
    if media.startswith("text/event-stream"):
        # The stream ran to its end: a terminal Responses event, or the chat stream's [DONE].
        ends = (
            ("event: response.completed", "event: response.incomplete", "event: response.failed")
            if endpoint == "/responses"
            else ("data: [DONE]",)
        )
        assert any(end in response.text for end in ends), response.text[-500:]
        return
    body = response.json()
    assert body["object"] == ("response" if endpoint == "/responses" else "chat.completion"), body


@pytest.fixture(scope="module")
def http(chain) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=chain.v1, timeout=30) as client:
        yield client


def _send(http: httpx.Client, endpoint: str, body: object) -> None:
    check_reply(http.post(endpoint, content=orjson.dumps(body), headers={"content-type": "application/json"}), endpoint)


HTTP_SETTINGS = settings(
    max_examples=int(300 * SCALE),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@HTTP_SETTINGS
@given(body=json_values, endpoint=st.sampled_from(["/responses", "/chat/completions"]))
def test_any_json_value_gets_a_clean_answer(http, body, endpoint):
    _send(http, endpoint, body)


@HTTP_SETTINGS
@given(body=responses_bodies)
def test_near_valid_responses_bodies_get_a_clean_answer(http, body):
    _send(http, "/responses", body)


@HTTP_SETTINGS
@given(body=chat_bodies)
def test_near_valid_chat_bodies_get_a_clean_answer(http, body):
    _send(http, "/chat/completions", body)


# ---- the translator, in-process ---------------------------------------------------------------------


@settings(
    max_examples=int(1000 * SCALE),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(body=responses_bodies | st.dictionaries(st.sampled_from(sorted(RESPONSES_FIELDS) + ["input"]), json_values))
def test_responses_to_chat_returns_or_raises_a_400(body):
    # The endpoint takes these two out of the body before it translates.
    check_translation({k: v for k, v in body.items() if k not in ("proxy_x_session_id", "return_token_id_information")})


@pytest.mark.parametrize("role", [[], {}, ["user"]])
def test_message_role_of_the_wrong_type_is_a_400(role):
    check_translation({"input": [{"type": "message", "role": role, "content": "hi"}]})


def check_translation(body: dict) -> None:
    try:
        translated = responses_to_chat(body)
    except OpenAIError as error:
        assert error.status == 400
        assert error.message and (error.param is None or isinstance(error.param, str))
        return
    assert isinstance(translated, ChatRequest)
    # What it hands on is a chat body the chat endpoint would itself accept, and it can be sent.
    validate_chat(translated.body)
    orjson.dumps(translated.body)


# ---- schemathesis against docs/openapi.yaml ----------------------------------------------------------

try:
    import schemathesis
    from schemathesis import checks as generic_checks
    from schemathesis.config import PositiveDataAcceptanceConfig
    from schemathesis.specs.openapi import checks as openapi_checks
except ImportError:  # the test extra pins it; without it only this part is skipped
    schemathesis = None

SCHEMATHESIS_EXAMPLES = int(25 * SCALE)  # per operation and generation mode
MODEL_ENDPOINTS = set(model_paths())

if schemathesis is None:

    def test_api_matches_openapi():
        pytest.skip("schemathesis is not installed")

else:
    # Loaded at import: schemathesis' lazy from_fixture loader reads a pytest-internal attribute that
    # pytest 9 no longer has. The chain's address is given per call instead.
    API_SCHEMA = schemathesis.openapi.from_path(OPENAPI)
    API_SCHEMA.config.update(request_timeout=30)
    API_SCHEMA.config.generation.update(max_examples=SCHEMATHESIS_EXAMPLES, database="none")
    # A valid rollout request may still be a 422: the fuzzed sessions are not token-contiguous rollouts.
    # `/ui` answers its documented redirect to `/ui/`.
    API_SCHEMA.config.checks.positive_data_acceptance = PositiveDataAcceptanceConfig(
        expected_statuses=["2XX", "307", "401", "404", "422"]
    )

    @API_SCHEMA.parametrize()
    @settings(deadline=None, suppress_health_check=list(HealthCheck))
    def test_api_matches_openapi(case, chain):
        """No 500, documented statuses and media types, bodies that match the schema.

        Schema-violating input must be refused (negative_data_rejection) everywhere but on the model
        endpoints, which accept (and forward) fields beyond the schema by design; schema-valid input need
        only be accepted on the GET routes, as a JSON Schema cannot say that a tool_choice must name one
        of the request's tools.
        """
        checks = [
            generic_checks.not_a_server_error,
            openapi_checks.status_code_conformance,
            openapi_checks.content_type_conformance,
            openapi_checks.response_schema_conformance,
        ]
        if case.path not in MODEL_ENDPOINTS:
            checks.append(openapi_checks.negative_data_rejection)
        if case.method == "GET" and not _filters_that_exclude_each_other(case):
            checks.append(openapi_checks.positive_data_acceptance)
        case.call_and_validate(base_url=chain.url, checks=checks)

    def _filters_that_exclude_each_other(case) -> bool:
        """`roots_only=true` with `kind=child` on the session list: each value valid, the two together the
        documented 400 naming `kind` (test_session_views.py); OpenAPI cannot say that two parameters
        exclude each other, so schemathesis sends the pair now and then as valid data."""
        query = case.query or {}
        return (
            case.path == "/v1/sessions"
            and str(query.get("roots_only", "")).lower() in {"true", "1", "yes"}
            and query.get("kind") == "child"
        )


def test_server_is_healthy_after_fuzzing(chain, http):
    """Last in the file, so after every fuzz test above: the process is alive, healthy, and logged no crash."""
    assert chain.proc.popen.poll() is None
    assert httpx.get(chain.url + "/health").json()["status"] == "ok"
    assert http.post("/responses", json={"input": "still fine?"}).status_code == 200
    output = chain.proc.output()
    assert "Traceback" not in output and "unhandled error" not in output, output[-3000:]
