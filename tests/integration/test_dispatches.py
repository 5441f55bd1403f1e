"""Two dispatches of the same rollout ids against one server, as an RL loop sends them (NeMo Gym's
`/ng-rollout/<task>-<repeat>/` prefix, through the real stack): each dispatch is its own whole rollout,
the latest by default and the earlier one by number, and the export holds both, nothing masked or stitched.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import httpx
import openai
import orjson
import pytest

from server.capture.catalog import runs
from server.capture.catalog.sessions import build_rollout
from server.capture.store import CaptureStore
from server.cli.sessions import main as sessions_main

TOOLS = [
    {
        "type": "function",
        "name": "bash",
        "description": "Run a shell command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    }
]
DEVELOPER = {"role": "developer", "content": "You are a careful agent. Use the tools."}


def run_dispatch(chain, rollout_id: str, task: str) -> None:
    """One rollout as Gym's simple agent runs it: a tool call, its result, the answer (Responses API)."""
    client = openai.OpenAI(
        base_url=f"{chain.url}/ng-rollout/{rollout_id}/v1",
        api_key="sk-test",
        max_retries=0,
        http_client=httpx.Client(timeout=60),
    )
    prompt = {
        "role": "user",
        "content": f'{task} [[mock:tool bash {{"command": "ls"}}]] [[mock:next]] [[mock:say done]]',
    }
    first = client.responses.create(model="mock-model", input=[DEVELOPER, prompt], tools=TOOLS)
    call = next(item for item in first.output if item.type == "function_call")
    history = [DEVELOPER, prompt, *[item.model_dump(exclude_none=True) for item in first.output]]
    history.append({"type": "function_call_output", "call_id": call.call_id, "output": "a.txt"})
    second = client.responses.create(model="mock-model", input=history, tools=TOOLS)
    assert second.output_text.strip() == "done"


def get(chain, session: str, view: str, **params: str) -> dict:
    reply = httpx.get(f"{chain.v1}/sessions/{quote(session, safe='')}/{view}", params=params, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()


def check_dispatches(rollout_of, records: list[dict], engine: list[dict]) -> None:
    """`rollout_of(dispatch)` (None: the default) gives each dispatch of a two-dispatch session whole,
    with exactly its own calls; the calls are what the engine served."""
    assert len(records) == 4
    assert [r["generation_token_ids"] for r in records] == [e["generation_token_ids"] for e in engine]
    latest = rollout_of(None)
    assert (latest["dispatch"], latest["dispatches"]) == (2, 2)
    assert latest["mask_sample"] is False and latest["partial_reason"] is None
    assert latest["record_uuids"] == [r["uuid"] for r in records[2:]]
    earlier = rollout_of(1)
    assert earlier["dispatch"] == 1 and earlier["mask_sample"] is False
    assert earlier["record_uuids"] == [r["uuid"] for r in records[:2]]
    # Token for token the engine's: the output's last generated turn carries the dispatch's last generation.
    generated = [item for item in latest["output"] if item.get("generation_token_ids")]
    assert generated[-1]["generation_token_ids"] == records[3]["generation_token_ids"]


@pytest.fixture(autouse=True)
def fresh_mock(mock_upstream):
    httpx.post(mock_upstream + "/mock/reset")
    yield


@pytest.mark.parametrize("prompts", ["other", "same"])
def test_two_dispatches_of_the_same_rollout_ids_are_two_whole_rollouts(chain, prompts, tmp_path, monkeypatch):
    ids = [f"disp-{prompts}-{repeat}" for repeat in range(2)]
    mark = chain.engine_mark()
    for dispatch in ("first", "second"):
        for rollout_id in ids:
            task = "List the files." if prompts == "same" else f"List the files ({dispatch} dispatch, {rollout_id})."
            run_dispatch(chain, rollout_id, task)
    served = chain.engine_calls(after=mark)
    assert len(served) == 8
    if prompts == "same":  # the mock samples alike: dispatch two's calls are dispatch one's, token for token
        assert served[0]["prompt_token_ids"] == served[4]["prompt_token_ids"]
        assert served[1]["prompt_token_ids"] == served[5]["prompt_token_ids"]

    for n, rollout_id in enumerate(ids):
        records = chain.records(rollout_id, wait_s=10)
        engine = [served[n * 2], served[n * 2 + 1], served[4 + n * 2], served[4 + n * 2 + 1]]

        def over_http(dispatch, rollout_id=rollout_id):
            return get(chain, rollout_id, "rollout", **({"dispatch": str(dispatch)} if dispatch else {}))

        check_dispatches(over_http, records, engine)
        chains = get(chain, rollout_id, "chains")
        assert chains["dispatch"] == 2 and [c["record_uuids"] for c in chains["chains"]] == [
            [r["uuid"] for r in records[2:]]
        ]
        assert chains["breaks"] == []  # no break, and never a "compacted" one
        listing = httpx.get(chain.v1 + "/sessions", params={"q": rollout_id, "summary": "true"}).json()
        summary = listing["sessions"][0]["summary"]
        assert summary["mask_sample"] is False and [d["calls"] for d in summary["dispatches"]] == [2, 2]

    # The export of the same captures: both dispatches of every id, each its own whole line.
    out = tmp_path / "rollouts.jsonl"
    assert sessions_main(["sessions", "export", "--url", chain.url, "--out", str(out)]) == 0
    lines = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    ours = [line for line in lines if line["session_id"] in ids]
    assert sorted((line["session_id"], line["dispatch"]) for line in ours) == [(i, d) for i in ids for d in (1, 2)]
    assert not any(line["mask_sample"] for line in ours)


def _read_in_place(capture_dir: Path, session: str):
    reader = CaptureStore.open_read_only(capture_dir)
    records, _ = reader.read_completions(session)

    def rollout_of(dispatch):
        return build_rollout(reader, session, run=runs.with_dispatch(runs.LATEST, dispatch))

    return rollout_of, records


@pytest.mark.parametrize("prompts", ["other", "same"])
def test_without_the_split_the_dispatches_mix(chain, prompts, monkeypatch):
    """The negative control: the same captures read with the segmentation turned off fail the check."""
    rollout_id = f"disp-off-{prompts}"
    mark = chain.engine_mark()
    for dispatch in ("first", "second"):
        run_dispatch(chain, rollout_id, "List the files." if prompts == "same" else f"List ({dispatch}).")
    engine = chain.engine_calls(after=mark)
    chain.records(rollout_id, wait_s=10)  # on disk
    rollout_of, records = _read_in_place(chain.capture_dir, rollout_id)
    check_dispatches(rollout_of, records, engine)  # the control's control: read in place, it holds
    monkeypatch.setattr(runs, "split", lambda records, fresh_starts=(): [records] if records else [])
    rollout_of, records = _read_in_place(chain.capture_dir, rollout_id)
    with pytest.raises(AssertionError):
        check_dispatches(rollout_of, records, engine)
    mixed = rollout_of(None)
    if prompts == "other":  # the first dispatch, masked as a "compaction"; the second in no rollout
        assert mixed["mask_sample"] is True and mixed["record_uuids"] == [r["uuid"] for r in records[:2]]
    else:  # stitched across the dispatches and reported whole
        assert mixed["mask_sample"] is False
        assert set(mixed["record_uuids"]) & {r["uuid"] for r in records[:2]}
        assert set(mixed["record_uuids"]) & {r["uuid"] for r in records[2:]}
