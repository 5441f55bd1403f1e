"""The /tokenize client against the mock's ASGI app served on loopback: one round trip per call once learned."""

from __future__ import annotations

import asyncio
import threading

import orjson
import pytest
import uvicorn
from hypothesis import given
from hypothesis import strategies as st

from server.dev.mock_upstream.app import create_app
from server.injection.id_lists import is_id_list
from server.injection.tokenize import Render, TokenizeClient, TokenizeError, _tokens_cut_out, template_options
from tests.support.procs import free_port, wait_for

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def mock_url():
    app = create_app()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, 10, interval=0.02)
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


# ---- the answer's ids taken as bytes ---------------------------------------------------------------

ids_strategy = st.lists(st.integers(min_value=0, max_value=2**31), max_size=30)


@given(ids_strategy, st.one_of(st.none(), st.integers(min_value=1, max_value=10**6)), st.booleans())
def test_a_vllm_shaped_answer_is_cut_out_and_agrees_with_parsing_it_whole(ids, model_len, with_strs):
    answer = {"count": len(ids), "max_model_len": model_len, "tokens": ids, "token_strs": ["x"] if with_strs else None}
    raw = orjson.dumps(answer)
    assert _tokens_cut_out(raw) == (orjson.dumps(ids), len(ids), model_len)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"tokens": [1, 2], "count": 2}',  # spaced: not cut, parsed whole
        b'{"tokens":[1,2]}',  # no count to agree with
        b'{"count":3,"tokens":[1,2]}',  # a count that disagrees
        b'{"count":2,"tokens":[1,-2]}',
        b'{"count":2,"tokens":[1,2.0]}',
        b'{"count":2,"tokens":[1,,2]}',
        b'{"count":1,"extra":{"tokens":[5]},"tokens":[7]}',  # a nested object's key comes first
        b'{"count":1,"tokens":[7',  # cut short
        b'["tokens",[1]]',
    ],
)
def test_an_answer_laid_out_otherwise_is_not_cut(raw):
    assert _tokens_cut_out(raw) is None


def test_a_nested_key_would_fool_a_cut_without_its_checks():
    # The negative control for the checks above: the first `"tokens":[` here is a nested object's.
    raw = b'{"count":1,"extra":{"tokens":[5]},"tokens":[7]}'
    at = raw.find(b'"tokens":[')
    assert raw[at + 9 : raw.find(b"]", at) + 1] == b"[5]" and orjson.loads(raw)["tokens"] == [7]


def test_a_render_gives_the_prompt_after_a_chain_cut_point():
    render = Render(b"[1,2,30,4]", 4, None, generation_prompt=(8, 9))
    assert render.prefix == [1, 2, 30, 4] and render.prompt == [1, 2, 30, 4, 8, 9] and render.prompt_len == 6
    assert render.prompt_after(b"[1,2]") == [30, 4, 8, 9]
    assert render.prompt_after(b"[1,2,30,4]") == [8, 9]
    whole = Render.of_lists([1, 2, 3], [1, 2, 5, 3, 9], None)  # a generation prompt that is not a plain suffix
    assert whole.prefix_len == 3 and whole.prompt_len == 5 and whole.prompt_after(b"[1,2]") == [5, 3, 9]
