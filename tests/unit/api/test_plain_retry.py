"""The one "post, then once more without the injected ids" path: every way a chat call goes upstream
(post, stream, buffered stream) retries a refused injected call plainly, and only that call."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from middleware.correlation import Correlation
from server.api.call import Call, ModelEndpoint
from server.errors import OpenAIError
from server.upstream.client import UpstreamReply

PLAIN = {"model": "r", "messages": [{"role": "user", "content": "hi"}], "stream": False}
INJECTED = {**PLAIN, "prompt_token_ids": [1, 2, 3]}
ANSWER = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}


class Upstream:
    """Refuses the first call with `status`, answers the rest; keeps what each call sent."""

    def __init__(self, status: int) -> None:
        self.status = status
        self.sent: list[dict[str, Any]] = []

    def _take(self, payload: bytes) -> None:
        self.sent.append(orjson.loads(payload))
        if len(self.sent) == 1:
            raise OpenAIError(self.status, "the engine refused the field")

    async def post(self, path: str, payload: bytes, headers: dict[str, str]) -> UpstreamReply:
        self._take(payload)
        return UpstreamReply(200, orjson.dumps(ANSWER), {})

    async def open_stream(self, path: str, payload: bytes, headers: dict[str, str]) -> Any:
        self._take(payload)
        return SimpleNamespace(headers={})


class Injector:
    def __init__(self) -> None:
        self.reissued = 0

    def reissue(self, plan: Any) -> dict[str, Any]:
        self.reissued += 1
        return dict(PLAIN)


def endpoint(status: int, *, buffered: bool = False) -> tuple[ModelEndpoint, Upstream, Injector]:
    upstream, injector = Upstream(status), Injector()
    state = SimpleNamespace(
        settings=SimpleNamespace(buffer_upstream_streams=buffered),
        require_upstream=lambda: upstream,
        injector=injector,
    )
    return ModelEndpoint(state), upstream, injector  # type: ignore[arg-type]


def call(*, injected: bool = True, stream: bool = False) -> Call:
    plan = SimpleNamespace(injected=injected)
    return Call(
        Correlation(),
        "req_1",
        "r",
        dict(INJECTED),
        orjson.dumps(INJECTED),
        stream,
        True,
        frozenset(),
        0.0,
        injection=plan,  # type: ignore[arg-type]
    )


SPAN = SimpleNamespace(answered_by=lambda model: None)


def send(how: str, model_endpoint: ModelEndpoint, the_call: Call) -> Any:
    if how == "post":
        return asyncio.run(model_endpoint.post_chat(the_call, {}, SPAN))  # type: ignore[arg-type]
    return asyncio.run(model_endpoint.open_chat_stream(the_call, {}, SPAN))  # type: ignore[arg-type]


@pytest.mark.parametrize(("how", "buffered"), [("post", False), ("stream", False), ("stream", True)])
@pytest.mark.parametrize("status", [400, 422])
def test_a_refused_injected_call_goes_once_more_plainly(how, buffered, status):
    model_endpoint, upstream, injector = endpoint(status, buffered=buffered)
    send(how, model_endpoint, call(stream=how == "stream"))
    assert injector.reissued == 1
    assert len(upstream.sent) == 2
    assert "prompt_token_ids" in upstream.sent[0] and "prompt_token_ids" not in upstream.sent[1]


@pytest.mark.parametrize(("how", "buffered"), [("post", False), ("stream", False), ("stream", True)])
def test_other_refusals_and_plain_calls_are_not_sent_again(how, buffered):
    # Negative controls: a 5xx, or a call that carried no injected ids, is the client's error as it came.
    for status, injected in ((500, True), (400, False)):
        model_endpoint, upstream, injector = endpoint(status, buffered=buffered)
        with pytest.raises(OpenAIError) as refused:
            send(how, model_endpoint, call(injected=injected, stream=how == "stream"))
        assert refused.value.status == status
        assert injector.reissued == 0 and len(upstream.sent) == 1
