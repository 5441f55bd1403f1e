"""`item_reference` over HTTP, with keys: a key's own stored items resolve; another key's, or an unknown
id, get a 404 in the OpenAI shape naming the id (never a word about upstreams)."""

from __future__ import annotations

import httpx
import pytest

from tests.support.stack import launch_stack


@pytest.fixture(scope="module")
def keyed(mock_upstream, tmp_path_factory):
    folder = tmp_path_factory.mktemp("keyed")
    config = folder / "cfg.yaml"
    config.write_text("api_keys: [key-a, key-b]\n")
    stack = launch_stack(mock_upstream, folder / "cap", "--config", str(config))
    yield stack
    stack.proc.stop()


def post(stack, key: str, body: dict) -> httpx.Response:
    return httpx.post(
        stack.v1 + "/responses",
        json={"model": "demo", **body},
        headers={"authorization": f"Bearer {key}", "x-session-id": f"refs-{key}"},
        timeout=60,
    )


def test_a_keys_own_items_resolve_and_are_listed_resolved(keyed):
    first = post(keyed, "key-a", {"input": "remember me"}).json()
    answer_id = first["output"][-1]["id"]
    reference = {"type": "item_reference", "id": answer_id}
    second = post(keyed, "key-a", {"input": [reference, {"role": "user", "content": "and?"}], "stream": True})
    assert second.status_code == 200 and "response.completed" in second.text
    third = post(keyed, "key-a", {"input": [reference, {"role": "user", "content": "again"}]}).json()
    listed = httpx.get(
        f"{keyed.v1}/responses/{third['id']}/input_items",
        params={"order": "asc"},
        headers={"authorization": "Bearer key-a"},
        timeout=30,
    ).json()["data"]
    assert listed[0] == first["output"][-1] and listed[1]["role"] == "user"


@pytest.mark.parametrize("whose", ["another key's", "unknown"])
def test_another_keys_or_an_unknown_item_is_404_naming_it(keyed, whose):
    item_id = post(keyed, "key-a", {"input": "mine"}).json()["output"][-1]["id"] if whose != "unknown" else "msg_nope"
    reply = post(
        keyed, "key-b", {"input": [{"role": "user", "content": "x"}, {"type": "item_reference", "id": item_id}]}
    )
    assert reply.status_code == 404, reply.text
    error = reply.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("not_found_error", "item_not_found", "input[1]")
    assert item_id in error["message"] and "upstream" not in error["message"]
