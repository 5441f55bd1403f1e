"""max_model_len discovery: asked from the vLLM server behind each passthrough route."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from server.switchyard import discovery

# ---- max_model_len discovery ----------------------------------------------------------------


def _discover(handler, base_url: str = "http://vllm.test/v1", model: str = "m") -> int | None:
    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await discovery.discover_max_model_len(base_url, model, client)

    return asyncio.run(go())


def _models(*entries):
    return lambda request: httpx.Response(200, json={"object": "list", "data": list(entries)})


def test_discovery_prefers_the_named_model_and_asks_v1_models():
    urls = []

    def handler(request):
        urls.append(str(request.url))
        return _models({"id": "base", "max_model_len": 4096}, {"id": "m", "max_model_len": 40960})(request)

    assert _discover(handler) == 40960
    assert _discover(handler, base_url="http://vllm.test/") == 40960
    assert urls == ["http://vllm.test/v1/models", "http://vllm.test/v1/models"]


def test_discovery_falls_back_to_the_first_entry_with_a_length():
    assert _discover(_models({"id": "other"}, {"id": "lora", "max_model_len": 8192})) == 8192


@pytest.mark.parametrize(
    "handler",
    [
        _models({"id": "m", "max_model_len": True}),
        _models({"id": "m", "max_model_len": "4096"}),
        _models(),
        lambda request: httpx.Response(500, json={"error": "boom"}),
        lambda request: httpx.Response(200, content=b"not json"),
        lambda request: httpx.Response(200, json=["a", "list"]),
    ],
)
def test_discovery_returns_none_when_the_server_does_not_say(handler):
    assert _discover(handler) is None


def test_discovery_of_an_unreachable_server_is_none(caplog):
    from tests.support.procs import free_port

    async def go():
        async with httpx.AsyncClient() as client:
            return await discovery.discover_max_model_len(f"http://127.0.0.1:{free_port()}/v1", "m", client)

    assert asyncio.run(go()) is None
    assert "max_model_len" in caplog.text
