"""The /tokenize client against the mock's ASGI app served on loopback: one round trip per call once learned."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import uvicorn

from server.dev.mock_upstream.app import create_app
from server.injection.ids import is_id_list
from server.injection.tokenize import TokenizeClient, TokenizeError, template_options
from tests.support.procs import free_port

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def mock_url():
    app = create_app()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}", app.state.mock
    server.should_exit = True
    thread.join(5)


def test_render_learns_the_generation_prompt_then_asks_once_per_call(mock_url):
    url, state = mock_url
    client = TokenizeClient(url + "/v1")  # a /v1 base URL is cut back to the engine root

    async def go():
        first = await client.render(MESSAGES, None, {})
        before = state.stats.tokenize
        second = await client.render(MESSAGES + [{"role": "user", "content": "more"}], None, {})
        client.close()  # on the loop its connections belong to
        return first, second, state.stats.tokenize - before

    first, second, calls = asyncio.run(go())
    assert first.prompt[: len(first.prefix)] == first.prefix and len(first.prompt) > len(first.prefix)
    assert first.max_model_len == 32768
    assert calls == 1  # steady state: one round trip
    assert second.prompt == state.prompt_ids(MESSAGES + [{"role": "user", "content": "more"}], None, True)


def test_the_same_request_bytes_are_answered_from_the_cache_until_they_expire(mock_url):
    url, state = mock_url
    more = MESSAGES + [{"role": "user", "content": "a retried call"}]

    async def go(client: TokenizeClient):
        await client.render(MESSAGES, None, {})  # learns the generation prompt
        before = state.stats.tokenize
        first = await client.render(more, None, {})
        again = await client.render(more, None, {})  # a retry: the same bytes
        other = await client.render(more, None, {"chat_template_kwargs": {"enable_thinking": False}})
        client.close()
        return first, again, other, state.stats.tokenize - before

    first, again, _, asked = asyncio.run(go(TokenizeClient(url)))
    assert again == first
    assert asked == 1 + 2  # the retry was not asked; other template options were (learning their prompt too)
    first, again, _, asked = asyncio.run(go(TokenizeClient(url, cache_ttl_s=-1)))  # negative control: no cache
    assert again == first and asked == 2 + 2


def test_an_unreachable_engine_is_a_tokenize_error():
    client = TokenizeClient(f"http://127.0.0.1:{free_port()}", timeout_s=2)
    with pytest.raises(TokenizeError):
        asyncio.run(client.render(MESSAGES, None, {}))


def test_template_options_carry_what_changes_the_render():
    request = {"messages": [], "chat_template_kwargs": {"enable_thinking": False}, "temperature": 0.5}
    assert template_options(request) == {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.mark.parametrize("ids", [[], [0], [12, 3, 151643], [2**63 - 1]])
def test_token_lists_of_non_negative_ints_are_accepted(ids):
    assert is_id_list(ids)


@pytest.mark.parametrize(
    "bad", [None, "1,2", {"a": 1}, [1, -2], [1, True], [False], [1.0], [1e20], [[1]], ["1"], [None], [2**70]]
)
def test_anything_but_a_list_of_non_negative_ints_is_refused(bad):
    assert not is_id_list(bad)
