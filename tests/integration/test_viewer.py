"""The rollout viewer in a real browser (Debian's chromium driven by Playwright).

Most tests read a capture directory written with the store's own writer (tests/support/viewer_data.py)
and served by `switchyard-model sessions view`; one drives the live chain and a key-protected server.
Every page load fails its test on a console error or an uncaught page error. Screenshots go to a
temporary directory, and to $VIEWER_SCREENSHOT_DIR as well when it is set (docs/img is refreshed so).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from server.capture.store import CaptureStore
from tests.support.procs import Proc, start_server, wait_for
from tests.support.viewer_data import XSS_MARKUP, write_demo_sessions

playwright_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--headless",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
FILLERS = 60


def launch_browser(playwright):
    """Debian's chromium; never a downloaded browser (`make chromium` installs it)."""
    if not os.path.exists(CHROMIUM):
        pytest.fail(
            f"{CHROMIUM} is missing: run `make chromium` (as root: apt-get update && apt-get install -y chromium)"
        )
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


def start_view(capture_dir: Path, *options: str) -> tuple[Proc, str]:
    """`switchyard-model sessions view --capture-dir D --port 0`; the URL is read from what it prints."""
    proc = Proc([sys.executable, "-m", "server.cli", "sessions", "view", "--capture-dir", str(capture_dir), *options])

    def printed_or_exited() -> re.Match[str] | bool:
        return re.search(r"(http://127\.0\.0\.1:\d+/ui/)", proc.output()) or proc.popen.poll() is not None

    match = wait_for(printed_or_exited, 60)
    if isinstance(match, re.Match):
        return proc, match.group(1)
    if proc.popen.poll() is not None:
        raise RuntimeError(f"sessions view exited early:\n{proc.output()}")
    proc.stop()
    raise TimeoutError(f"sessions view printed no URL:\n{proc.output()}")


class Pages:
    """Opens pages on one shared browser; collects console errors and page errors per page."""

    def __init__(self, browser, shots: list[Path]) -> None:
        self.browser = browser
        self.shots = shots
        self.opened: list[tuple[object, list[str]]] = []

    def open(self, url: str, *, allow: tuple[str, ...] = ()):
        context = self.browser.new_context(
            viewport={"width": 1200, "height": 800}, accept_downloads=True, timezone_id="UTC"
        )
        page = context.new_page()
        errors: list[str] = []

        def on_console(message) -> None:
            if message.type == "error" and not any(text in message.text for text in allow):
                errors.append(f"console: {message.text}")

        page.on("console", on_console)
        page.on("pageerror", lambda error: errors.append(f"pageerror: {error}"))
        page.on("dialog", lambda dialog: (errors.append(f"dialog: {dialog.message}"), dialog.dismiss()))
        self.opened.append((context, errors))
        page.goto(url)
        wait_ready(page)
        return page

    def shot(self, page, name: str, *, full_page: bool = False) -> None:
        for directory in self.shots:
            page.screenshot(path=str(directory / f"{name}.png"), full_page=full_page)

    def check_and_close(self) -> list[str]:
        problems = [error for _, errors in self.opened for error in errors]
        for context, _ in self.opened:
            context.close()
        self.opened.clear()
        return problems


def open_call(page, index: int) -> None:
    """Unfold one call of the timeline (its body is built when first opened)."""
    page.eval_on_selector(f"#call-{index}", "d => { d.open = true; }")
    page.wait_for_selector(f"#call-{index} .call-body")


def wait_ready(page) -> None:
    page.wait_for_selector("body[data-ready=true]", timeout=20_000)


def go(page, url: str) -> None:
    page.evaluate("document.body.dataset.ready = 'false'")
    page.goto(url)
    wait_ready(page)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    capture_dir = tmp_path_factory.mktemp("viewer-captures")
    facts = write_demo_sessions(capture_dir, fillers=FILLERS)
    proc, url = start_view(capture_dir)
    yield {"url": url, "root": url.removesuffix("ui/"), "store": CaptureStore.open_read_only(capture_dir), **facts}
    proc.stop()


@pytest.fixture(scope="module")
def chromium():
    with playwright_api.sync_playwright() as playwright:
        browser = launch_browser(playwright)
        yield browser
        browser.close()


@pytest.fixture
def pages(chromium, tmp_path):
    shots = [tmp_path]
    if os.environ.get("VIEWER_SCREENSHOT_DIR"):
        shots.append(Path(os.environ["VIEWER_SCREENSHOT_DIR"]))
        shots[-1].mkdir(parents=True, exist_ok=True)
    opener = Pages(chromium, shots)
    yield opener
    problems = opener.check_and_close()
    assert not problems, f"browser errors: {problems}"


def row_ids(page) -> list[str]:
    return page.eval_on_selector_all("#sessions tbody tr", "rows => rows.map(r => r.dataset.sessionId)")


def all_ids(demo) -> list[str]:
    return sorted(entry["session_id"] for entry in demo["store"].list_sessions(limit=10_000))


# ---- the list ------------------------------------------------------------------------------------


def test_list_pages_through_every_session_once(demo, pages):
    page = pages.open(demo["url"] + "#/?limit=25")
    pages.shot(page, "viewer-list")
    seen = []
    first_page = row_ids(page)
    assert len(first_page) == 25
    while True:
        seen += row_ids(page)
        if page.is_disabled("#next-page"):
            break
        page.evaluate("document.body.dataset.ready = 'false'")
        page.click("#next-page")
        wait_ready(page)
    assert seen == all_ids(demo)  # every session once, in id order, never the whole list at once
    page.evaluate("document.body.dataset.ready = 'false'")
    page.click("#prev-page")
    wait_ready(page)
    assert row_ids(page) == all_ids(demo)[25:50]


def test_list_columns_show_the_summary(demo, pages):
    page = pages.open(demo["url"] + "#/?q=agent-main&limit=25")
    records, _ = demo["store"].read_completions("agent-main")
    cells = page.eval_on_selector_all(
        "tr[data-session-id='agent-main'] td", "cells => cells.map(c => c.textContent.trim())"
    )
    assert cells[2] == str(len(records))
    assert cells[3] == f"{sum(r['token_count']['prompt_tokens'] for r in records):,}"
    assert cells[4] == f"{sum(r['token_count']['completion_tokens'] for r in records):,}"
    assert cells[7] == "tool_calls×2 stop×1"
    assert cells[8] == "mock-model"
    assert cells[9] == "whole"


def test_a_session_two_server_runs_wrote_is_marked_and_its_status_is_the_latest_runs(tmp_path, pages):
    from tests.unit.capture.test_runs import SESSION, _run

    capture_dir = tmp_path / "captures"
    _run(capture_dir, "run-a")
    _run(capture_dir, "run-b", sampled=9)  # the same id again, sampled anew: merged, the chain breaks
    _run(capture_dir, "run-b", session_id="one-run")
    proc, url = start_view(capture_dir)
    try:
        page = pages.open(url)
        cells = {
            sid: page.eval_on_selector_all(f"tr[data-session-id='{sid}'] td", "cells => cells.map(c => c.textContent)")
            for sid in (SESSION, "one-run")
        }
        assert cells[SESSION][0] == f"{SESSION}2 runs" and cells["one-run"][0] == "one-run"
        assert cells[SESSION][9].strip() == "whole"  # the latest run's rollout, as GET .../rollout answers
        page.evaluate("document.body.dataset.ready = 'false'")
        page.click(f"tr[data-session-id='{SESSION}'] a")
        wait_ready(page)
        page.click("#show-rollout")
        page.wait_for_selector("#rollout-verdict")
        assert "trainable" in page.text_content("#rollout-verdict")  # today's merge said mask_sample
    finally:
        proc.stop()


def test_pending_statuses_are_filled_in_on_the_page(demo, pages):
    # Every session counts as large here: the first answer has no status yet, the page asks again.
    proc, url = start_view(demo["store"].capture_dir, "--summary-read-limit-mb", "0")
    try:
        page = pages.open(url + "#/?q=agent&limit=25")
        first = badges(page)
        assert first and set(first.values()) == {"…"}  # nothing was summarised before this page asked
        wait_for(lambda: "…" not in badges(page).values(), 60, interval=0.2)
        # The control: the default server (4 MB limit) shows these small sessions' statuses at once.
        reference = pages.open(demo["url"] + "#/?q=agent&limit=25")
        assert badges(page) == badges(reference) and "…" not in badges(reference).values()
    finally:
        proc.stop()


def badges(page) -> dict[str, str]:
    return dict(
        page.eval_on_selector_all(
            "#sessions tbody tr",
            "rows => rows.map(r => [r.dataset.sessionId, r.querySelector('td.status').textContent])",
        )
    )


@pytest.mark.parametrize(
    ("form", "expected"),
    [
        ({"#f-q": "sub"}, lambda ids: [i for i in ids if "sub" in i]),
        ({"#f-kind": "child"}, lambda ids: ["agent-main-sub1"]),
        ({"#f-status": "partial"}, lambda ids: ["broken-reasoning"]),
        ({"#f-model": "model-b"}, lambda ids: [f"filler-{i:03d}" for i in range(1, FILLERS, 2)]),
        ({"#f-route": "route-x", "#f-q": "filler-00"}, lambda ids: [f"filler-{i:03d}" for i in range(0, 10, 2)]),
        # The second half of the fillers is a day later: a range ending on the first day leaves them out.
        (
            {"#f-until": "2025-03-01T23:00"},
            lambda ids: [i for i in ids if not i.startswith("filler-") or int(i[-3:]) < FILLERS // 2],
        ),
    ],
    ids=["id-search", "children", "partial", "model", "route-and-id", "time-range"],
)
def test_list_filters(demo, pages, form, expected):
    page = pages.open(demo["url"] + "#/?limit=200")
    for selector, value in form.items():
        if page.get_attribute(selector, "type") == "datetime-local":
            # The form's times are local wall time; the browser runs in UTC here.
            page.fill(selector, value)
        elif page.eval_on_selector(selector, "e => e.tagName") == "SELECT":
            page.select_option(selector, value)
        else:
            page.fill(selector, value)
    page.evaluate("document.body.dataset.ready = 'false'")
    page.click("form.filters button[type=submit]")
    wait_ready(page)
    want = expected(all_ids(demo))
    assert want, "the filter must select something, or this test shows nothing"
    assert row_ids(page) == want


def test_a_bad_filter_value_is_refused_with_the_api_error(demo, pages):
    page = pages.open(demo["url"] + "#/?status=everything", allow=("400",))
    assert "status must be one of" in page.text_content(".error")


# ---- a session -----------------------------------------------------------------------------------


def test_session_with_a_subagent_tree_timeline_and_turns(demo, pages):
    page = pages.open(demo["url"] + "#/s/agent-main")
    pages.shot(page, "viewer-session", full_page=True)
    store = demo["store"]
    main_records, _ = store.read_completions("agent-main")
    sub_records, _ = store.read_completions("agent-main-sub1")

    # Tree: the child hangs under the call whose reply asked for the `task` tool, tokens rolled up.
    spawner = next(
        i
        for i, r in enumerate(main_records)
        if any(c["function"]["name"] == "task" for c in r["messages"][-1].get("tool_calls", []))
    )
    child = page.locator("#tree li[data-session='agent-main-sub1']")
    assert child.locator(".spawned-by").text_content().strip() == f"· spawned by call #{spawner}"
    total_in = sum(r["token_count"]["prompt_tokens"] for r in main_records + sub_records)
    assert f"with sub-agents {len(main_records) + len(sub_records)} calls · {total_in:,} in" in page.text_content(
        "#tree li[data-session='agent-main']"
    )

    # Timeline: one entry per call; the newest open, older ones folded.
    calls = page.locator("details.call")
    assert calls.count() == len(main_records)
    opened = page.eval_on_selector_all("details.call", "ds => ds.map(d => d.open)")
    assert opened == [False] * (len(main_records) - 1) + [True]

    # The spawning call's turn: its reply's tool call with arguments, and the spawned session.
    open_call(page, spawner)
    body = page.locator(f"#call-{spawner} .call-body")
    assert "look around" in body.locator(".tool-call .args").last.text_content()
    assert body.locator(".spawned a").text_content() == "agent-main-sub1"
    # The next call added only the tool's result (what the sub-agent said); the rest it carried over.
    open_call(page, spawner + 1)
    next_body = page.locator(f"#call-{spawner + 1} .call-body")
    tool_result = main_records[spawner + 1]["messages"][-2]
    assert tool_result["role"] == "tool"
    assert next_body.locator(".msg").count() == 2  # the tool result, then the reply
    assert next_body.locator(".msg.role-tool pre").text_content() == tool_result["content"]
    assert f"{len(main_records[spawner + 1]['messages']) - 2} earlier messages carried over" in next_body.text_content()

    # Into the sub-agent and back up.
    go(page, demo["url"] + "#/s/agent-main-sub1")
    assert "Sub-agent of agent-main" in page.text_content(".session-head")
    assert page.locator("details.call").count() == len(sub_records)


def test_token_view_shades_by_logprob(demo, pages):
    page = pages.open(demo["url"] + "#/s/agent-main")
    records, _ = demo["store"].read_completions("agent-main")
    last = records[-1]
    page.click(f"#call-{len(records) - 1} .show-tokens")
    page.wait_for_selector(".tokens .tok")
    pages.shot(page, "viewer-tokens", full_page=True)
    chips = page.eval_on_selector_all(
        ".tokens .tok",
        "ts => ts.map(t => [Number(t.dataset.id), Number(t.dataset.logprob), t.textContent, getComputedStyle(t).backgroundColor])",
    )
    assert [c[0] for c in chips] == last["generation_token_ids"]
    assert [c[1] for c in chips] == pytest.approx(last["generation_log_probs"])
    assert "".join(c[2] for c in chips) == "".join(last["generation_token_texts"])
    # Shading follows the probability: the least likely token is the most strongly shaded.
    alphas = [float(re.findall(r"[\d.]+", c[3])[3]) if c[3].startswith("rgba") else 0.0 for c in chips]
    least, most = min(range(len(chips)), key=lambda i: chips[i][1]), max(range(len(chips)), key=lambda i: chips[i][1])
    assert chips[least][1] < chips[most][1]
    assert alphas[least] > alphas[most]
    assert alphas[least] == pytest.approx(min(0.85, (1 - math.exp(chips[least][1])) * 0.85), abs=0.01)


def test_contiguity_strip_points_at_the_first_differing_token(demo, pages):
    page = pages.open(demo["url"] + "#/s/broken-reasoning")
    pages.shot(page, "viewer-contiguity", full_page=True)
    records = demo["broken_records"]
    position = demo["broken_position"]
    kinds = page.eval_on_selector_all("#strip .cell", "cs => cs.map(c => c.dataset.kind)")
    assert kinds == ["first", "breaks"]
    detail = page.locator(".break")
    assert detail.get_attribute("data-position") == str(position)
    assert detail.locator(".position").text_content() == str(position)
    assert "inside the previous call's generated tokens" in detail.text_content()
    expected_ids = page.eval_on_selector_all(".break .window.expected .tok", "ts => ts.map(t => Number(t.dataset.id))")
    actual_ids = page.eval_on_selector_all(".break .window.actual .tok", "ts => ts.map(t => Number(t.dataset.id))")
    before_ids = page.eval_on_selector_all(".break .window.shared .tok", "ts => ts.map(t => Number(t.dataset.id))")
    previous, current = records[0], records[1]
    assert expected_ids == previous["generation_token_ids"][: len(expected_ids)]
    assert actual_ids == current["prompt_token_ids"][position : position + len(actual_ids)]
    assert before_ids == current["prompt_token_ids"][position - len(before_ids) : position]
    assert expected_ids[0] != actual_ids[0]
    # The dropped reasoning is what broke it: the expected side starts with the <think> the model generated.
    assert page.locator(".break .window.expected .tok").first.text_content() == "<think>"
    # The rollout says the same: partial, masked, and the call past the break is outside it.
    page.click("#show-rollout")
    page.wait_for_selector("#rollout-verdict")
    assert "mask_sample" in page.text_content("#rollout-verdict")
    assert "do not extend" in page.text_content("#partial-reason")
    assert "masked" in page.text_content("#call-1 > summary")


def test_contiguity_strip_of_an_unbroken_session_shows_no_break(demo, pages):
    # The control for the test above: the same page on a session whose chain holds.
    page = pages.open(demo["url"] + "#/s/agent-main")
    kinds = page.eval_on_selector_all("#strip .cell", "cs => cs.map(c => c.dataset.kind)")
    assert kinds[0] == "first" and set(kinds[1:]) == {"extends"}
    assert page.locator(".break").count() == 0
    assert page.locator("#no-breaks").is_visible()


def test_export_downloads_the_rollout_and_the_records(demo, pages):
    page = pages.open(demo["url"] + "#/s/agent-main")
    api = demo["root"] + "v1/sessions/agent-main"
    with page.expect_download() as download:
        page.click("#export-rollout")
    assert download.value.suggested_filename == "agent-main.rollout.json"
    rollout = json.loads(Path(download.value.path()).read_text())
    assert rollout == httpx.get(api + "/rollout").json()
    assert rollout["subagents"][0]["session_id"] == "agent-main-sub1"

    with page.expect_download() as download:
        page.click("#export-jsonl")
    assert download.value.suggested_filename == "agent-main.records.jsonl"
    lines = Path(download.value.path()).read_text().splitlines()
    assert [json.loads(line) for line in lines] == httpx.get(api + "/completions").json()["completions"]

    with page.expect_download() as download:
        page.click("#export-json")
    assert json.loads(Path(download.value.path()).read_text())["completions"] == [json.loads(line) for line in lines]


# ---- safety --------------------------------------------------------------------------------------

# Counts what markup the page made out of session text: any <img> or <script> inside the content.
COUNT_MARKUP = "() => document.querySelectorAll('#main img, #main script').length"


def test_markup_in_session_text_renders_as_text(demo, pages):
    page = pages.open(demo["url"] + "#/s/xss-session")
    page.click("details.call:last-of-type .show-tokens")
    page.wait_for_selector(".tokens .tok")
    page.click("#call-0 > summary")
    page.click("#show-rollout")
    page.wait_for_selector("#rollout-verdict")
    pages.shot(page, "viewer-xss")
    text = page.text_content("#main")
    assert text.count(XSS_MARKUP) >= 3  # user text, reply, rollout items: shown, as text
    assert "onerror='window.__xss=1'" in text  # the tool call's arguments
    assert page.evaluate(COUNT_MARKUP) == 0
    assert page.evaluate("window.__xss") is None
    # The same page, opened at the list: session text never reaches it as markup either.
    go(page, demo["url"] + "#/?q=xss")
    assert page.evaluate(COUNT_MARKUP) == 0


def test_the_markup_counter_sees_markup_when_text_is_parsed_as_html(demo, pages):
    # Negative control: had the viewer used innerHTML, the check above would have caught it.
    # The parsed <img> tries to load (a 404) and the page's policy refuses its handler: both are logged.
    page = pages.open(demo["url"] + "#/s/xss-session", allow=("Content Security Policy", "404"))
    page.evaluate(
        "text => { const d = document.createElement('div'); d.innerHTML = text; document.getElementById('main').append(d); }",
        XSS_MARKUP,
    )
    assert page.evaluate(COUNT_MARKUP) == 2


def test_invalid_ids_never_reach_the_api(demo, pages):
    requests: list[str] = []
    page = pages.open(demo["url"] + "#/", allow=("404",))
    page.on("request", lambda request: requests.append(request.url))
    # The viewer takes the server's own rule (printable ASCII, no spaces, not only dots): a space fails it.
    for invalid in ("has%20space", "..", "caf%C3%A9"):
        go(page, demo["url"] + f"#/s/{invalid}")
        assert "not a valid session id" in page.text_content(".error"), invalid
    assert not [url for url in requests if "/v1/sessions/" in url]
    # The API itself refuses the same shapes, in the OpenAI error shape.
    for path in (
        "v1/sessions/..%2F..%2Fetc/timeline",
        "v1/sessions/agent-main/completions/..%2Fx",
        "v1/sessions/.hidden/timeline",
    ):
        response = httpx.get(demo["root"] + path)
        assert response.status_code == 404, path
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_viewer_pages_carry_a_strict_content_security_policy(demo):
    response = httpx.get(demo["url"])
    assert response.status_code == 200
    policy = response.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "default-src 'none'" in policy
    assert '<script type="module" src="app.js">' in response.text


# ---- the live chain ------------------------------------------------------------------------------


def test_live_chain_behind_a_key(tmp_path, mock_upstream, pages):
    """Calls through the real chain (mock in reasoning mode), then the viewer on that server: it asks
    for the session key, and shows the reasoning session breaking where the reasoning was dropped."""
    config = tmp_path / "cfg.yaml"
    config.write_text(
        yaml.safe_dump({"deployment": "demo", "capture_dir": str(tmp_path / "cap"), "session_api_keys": ["viewer-key"]})
    )
    proc, url = start_server("--config", str(config), env={"MOCK_UPSTREAM_URL": mock_upstream + "/v1"})
    try:
        sdk = openai.OpenAI(
            base_url=url + "/v1",
            api_key="unused",
            default_headers={"x-session-id": "live-reasoning"},
            http_client=httpx.Client(),
            max_retries=0,
        )
        messages = [{"role": "user", "content": "think first [[mock:reasoning]]"}]
        first = sdk.chat.completions.create(model="any", messages=messages)
        # Like most clients, the history goes back without the reasoning.
        messages += [
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "again"},
        ]
        sdk.chat.completions.create(model="any", messages=messages)
        auth = {"authorization": "Bearer viewer-key"}
        records = httpx.get(url + "/v1/sessions/live-reasoning/completions", headers=auth).json()

        page = pages.open(url + "/ui/", allow=("401",))
        assert page.locator("#api-key").is_visible()  # no key yet: the page asks for one
        page.fill("#api-key", "viewer-key")
        page.evaluate("document.body.dataset.ready = 'false'")
        page.click(".key-form button")
        wait_ready(page)
        assert "live-reasoning" in row_ids(page)
        assert "viewer-key" not in page.url
        go(page, url + "/ui/#/s/live-reasoning")
        pages.shot(page, "viewer-live", full_page=True)
        position = len(records["completions"][0]["prompt_token_ids"])
        assert page.locator(".break").get_attribute("data-position") == str(position)
        assert page.locator(".break .window.expected .tok").first.text_content() == "<think>"
    finally:
        proc.stop()


# ---- chains and the rollout's items ---------------------------------------------------------------


def assert_no_object_text(page) -> None:
    """Nothing the page renders is a stringified object (a list or node handed to a DOM call as text)."""
    text = page.evaluate("document.body.innerText")
    assert "[object" not in text and "null,null" not in text


def show_rollout(page) -> list[dict]:
    page.click("#show-rollout")
    page.wait_for_selector("#rollout-verdict")
    return page.eval_on_selector_all(
        "#rollout-items .item",
        "items => items.map(i => ({type: i.dataset.type, role: i.dataset.role, trained: i.dataset.trained,"
        " text: i.querySelector('pre').textContent}))",
    )


def test_show_rollout_renders_the_items_of_a_whole_session(demo, pages):
    page = pages.open(demo["url"] + "#/s/agent-main")
    items = show_rollout(page)
    pages.shot(page, "viewer-rollout-items", full_page=True)
    assert_no_object_text(page)
    assert items[0]["role"] == "system" and items[0]["trained"] == "false"
    calls = [item for item in items if item["type"] == "function_call"]
    assert calls and calls[0]["text"].startswith("→ read(") and calls[0]["trained"] == "true"
    outputs = [item for item in items if item["type"] == "function_call_output"]
    assert outputs and all(item["role"] == "tool" and item["trained"] == "false" for item in outputs)
    assert items[-1]["role"] == "assistant" and "The test passes now." in items[-1]["text"]
    assert "trainable" in page.text_content("#rollout-verdict")
    chains = page.eval_on_selector_all("#chains li", "ls => ls.map(l => l.dataset.kind)")
    assert chains == ["main"]
    assert_no_object_text(page)


@pytest.fixture(scope="module")
def broken_view(tmp_path_factory):
    from tests.support.scripted_sessions import scripted

    capture_dir = tmp_path_factory.mktemp("chain-captures")
    store = CaptureStore(capture_dir)
    store.start()
    records = scripted("tool-text", ["extend", "tool_call_as_text", "extend"])
    for record in records:
        assert store.submit(record)
    assert store.flush(10)
    store.close()
    proc, url = start_view(capture_dir)
    yield {"url": url, "records": records}
    proc.stop()


def test_a_broken_session_shows_its_chains_one_verdict_and_its_rollout_items(broken_view, pages):
    page = pages.open(broken_view["url"] + "#/s/tool-text")
    pages.shot(page, "viewer-chains", full_page=True)
    assert_no_object_text(page)
    records = broken_view["records"]
    # The strip and the rollout agree: call 2 breaks, in words a user can act on.
    kinds = page.eval_on_selector_all("#strip .cell", "cs => cs.map(c => c.dataset.kind)")
    assert kinds == ["first", "extends", "breaks", "extends"]
    assert page.locator("#no-breaks").count() == 0
    detail = page.locator(".break")
    assert detail.get_attribute("data-kind") == "tool_call_as_text"
    assert "the client re-sent a tool call as text" in detail.text_content()
    assert "call #1" in detail.text_content()
    # The chains: every call in one, the second starting where the first broke.
    chains = page.locator("#chains li")
    assert chains.count() == 2
    assert chains.nth(0).get_attribute("data-kind") == "main"
    assert "calls #0, #1" in chains.nth(0).text_content()
    assert "calls #2, #3" in chains.nth(1).text_content()
    assert "starts after call #2: the client re-sent a tool call as text" in chains.nth(1).text_content()
    assert "100.0%" in page.text_content(".session-head")
    # The rollout: partial, masked, its reason in the same words, its items those of the first chain.
    items = show_rollout(page)
    assert_no_object_text(page)
    assert "mask_sample" in page.text_content("#rollout-verdict")
    assert "the client re-sent a tool call as text" in page.text_content("#partial-kind")
    generated = [item for item in items if item["trained"] == "true"]
    assert len(generated) == 2 and generated[0]["type"] == "function_call"
    assert len(records) == 4


def test_the_list_page_renders_no_object_text(demo, pages):
    page = pages.open(demo["url"])
    assert_no_object_text(page)
