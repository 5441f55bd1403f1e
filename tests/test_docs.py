"""The documentation stays true: its commands parse, every setting and route is in it, its curls work."""

from __future__ import annotations

import json
import re
import shlex
import unicodedata
from pathlib import Path

import httpx
import pytest

from server.cli.main import _serve_overrides, build_parser
from server.config import ENV_VARS, Settings

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
# The user documentation, and the README that links it.
GUIDES = [
    "quickstart.md",
    "configuration.md",
    "http-api.md",
    "capture.md",
    "harnesses.md",
    "architecture.md",
    "operations.md",
]
# Written by another engineer; linked from the guides, possibly not there yet.
LINKED_ELSEWHERE = {"observability.md", "benchmarks.md", "openapi.yaml"}
# The address the docs' examples use.
DOC_BASE = "http://127.0.0.1:8080"

SHELL_LANGS = {"bash", "sh", "shell", "console"}
_FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
_SHELL_OPERATORS = {"|", "||", "&&", ";", ">", ">>", "<", "2>", "&"}
_ENV_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def all_docs() -> list[Path]:
    return [REPO / "README.md", *sorted(DOCS.glob("*.md"))]


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block."""
    return [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(text)]


def command_lines(body: str) -> list[str]:
    """Logical lines of a shell block: backslash continuations joined, comments and blanks dropped."""
    lines, pending = [], ""
    for raw in body.splitlines():
        line = raw.strip()
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if line.startswith("$ "):
            line = line[2:]
        if line and not line.startswith("#"):
            lines.append(line)
    return lines


def cli_argv(line: str, *, shell_block: bool) -> list[str] | None:
    """The arguments after `switchyard-model` if the line runs it, else None.

    In a block that is not marked as shell, only lines that name the executable by path
    (`.venv/bin/switchyard-model ...`) count: a bare `switchyard-model ...` there is output.
    """
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError:
        return None
    while tokens and _ENV_ASSIGNMENT.match(tokens[0]):
        tokens = tokens[1:]
    if not tokens:
        return None
    head = tokens[0]
    if Path(head).name == "switchyard-model" and (shell_block or "/" in head):
        args = tokens[1:]
    elif shell_block and Path(head).name.startswith("python") and tokens[1:3] == ["-m", "server.cli"]:
        args = tokens[3:]
    else:
        return None
    for i, token in enumerate(args):
        if token in _SHELL_OPERATORS or token.startswith((">", "2>")):
            return args[:i]
    return args


def documented_commands() -> list[tuple[str, list[str]]]:
    found = []
    for path in all_docs():
        for lang, body in code_blocks(path.read_text()):
            if lang not in SHELL_LANGS and lang != "":
                continue
            for line in command_lines(body):
                argv = cli_argv(line, shell_block=lang in SHELL_LANGS)
                if argv is not None:
                    found.append((f"{path.name}: {line}", argv))
    return found


COMMANDS = documented_commands()


# ---- every command line in the docs parses -----------------------------------------------------


def test_the_docs_show_commands_for_every_subcommand():
    assert len(COMMANDS) >= 20, [c for c, _ in COMMANDS]
    shown = {argv[0] for _, argv in COMMANDS if argv}
    assert {"serve", "demo", "sessions", "profiles"} <= shown, shown
    quickstart = {c.split(":", 1)[1].strip() for c, _ in COMMANDS if c.startswith("quickstart.md")}
    assert any(" sessions tree " in c for c in quickstart) and any(" sessions export " in c for c in quickstart)


@pytest.mark.parametrize("where, argv", COMMANDS, ids=[c for c, _ in COMMANDS])
def test_documented_command_parses(where, argv):
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse reports a usage error as exit 2
        pytest.fail(f"{where!r} does not parse (exit {exc.code})")
    assert args.command == argv[0]


def test_extraction_skips_output_and_keeps_real_commands():
    assert cli_argv("switchyard-model listening on http://127.0.0.1:8080", shell_block=False) is None
    assert cli_argv("A=1 B=2 .venv/bin/switchyard-model serve --port 1 > log", shell_block=False) == [
        "serve",
        "--port",
        "1",
    ]
    assert command_lines("X=1 \\\n  switchyard-model demo\n# note\n") == ["X=1 switchyard-model demo"]


# ---- every setting is documented, and nothing else ---------------------------------------------


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    following = re.search(r"^## ", text[start + len(heading) :], re.MULTILINE)
    return text[start : start + len(heading) + following.start()] if following else text[start:]


def _cells(row: str) -> list[str]:
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", row.strip())[1:-1]]


def _ticked(cell: str) -> str | None:
    match = re.search(r"`([^`]+)`", cell)
    return match.group(1) if match else None


def settings_table() -> dict[str, dict[str, str | None]]:
    section = _section((DOCS / "configuration.md").read_text(), "## Settings reference")
    rows: dict[str, dict[str, str | None]] = {}
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        cells = _cells(line)
        assert len(cells) == 6, f"settings row needs 6 cells: {line}"
        name = _ticked(cells[0])
        assert name not in rows, f"{name} documented twice"
        rows[name] = {"default": _ticked(cells[2]), "env": _ticked(cells[3]), "flag": _ticked(cells[4])}
    return rows


def test_every_setting_is_documented_and_every_documented_setting_exists():
    documented = set(settings_table())
    fields = set(Settings.model_fields)
    assert not fields - documented, f"settings missing from configuration.md: {sorted(fields - documented)}"
    assert not documented - fields, f"configuration.md documents unknown settings: {sorted(documented - fields)}"


def test_documented_defaults_are_the_real_defaults():
    for name, row in settings_table().items():
        default = Settings.model_fields[name].get_default(call_default_factory=True)
        assert row["default"] is not None, f"{name}: no default shown"
        assert json.loads(row["default"]) == default, f"{name}: docs say {row['default']}, code says {default!r}"


def test_documented_environment_variables_are_the_real_ones():
    documented = {name: row["env"] for name, row in settings_table().items() if row["env"]}
    assert documented == ENV_VARS


def test_documented_flags_set_their_setting_and_cover_every_serve_flag():
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]  # argparse keeps subparsers here
    setting_flags = {
        s for a in serve._actions for s in a.option_strings if s.startswith("--") and s not in ("--help", "--config")
    }
    documented = {row["flag"]: name for name, row in settings_table().items() if row["flag"]}
    assert set(documented) == setting_flags
    for flag, name in documented.items():
        action = next(a for a in serve._actions if flag in a.option_strings)
        value = [] if action.nargs == 0 else ["7" if action.type is int else "x"]
        overrides = _serve_overrides(build_parser().parse_args(["serve", flag, *value]))
        assert overrides.get(name) is not None, f"{flag} does not set {name}"


# ---- every route is documented -----------------------------------------------------------------


def app_routes() -> set[str]:
    from server.app import create_app

    app = create_app(Settings(deployment="demo"))  # builds the app only; nothing starts
    # A path convertor (`{session_id:path}`) is routing detail; the docs name the parameter.
    return {
        f"{method} {re.sub(r':[a-z]+}', '}', route.path)}"
        for route in app.routes
        for method in route.methods - {"HEAD"}
    }


def test_every_route_is_in_the_http_api_doc():
    text = (DOCS / "http-api.md").read_text()
    missing = sorted(r for r in app_routes() if f"`{r}`" not in text)
    assert not missing, f"routes missing from http-api.md: {missing}"


def test_the_endpoint_table_lists_only_real_routes():
    text = (DOCS / "http-api.md").read_text()
    listed = {
        _ticked(_cells(line)[0]) for line in text.splitlines() if re.match(r"\| `(GET|POST|PUT|PATCH|DELETE) /", line)
    }
    assert listed == app_routes()


# ---- links between the docs resolve ---------------------------------------------------------------


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip().lower())
    kept = "".join(ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(_FENCE, "", path.read_text())
    seen: dict[str, int] = {}
    out = set()
    for match in re.finditer(r"^#{1,6} (.+)$", text, re.MULTILINE):
        base = slug(match.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def test_slugs_follow_githubs_rule():
    assert slug("`${oc.env:...}` in YAML values") == "ocenv-in-yaml-values"
    assert slug("Why the chain is shaped this way") == "why-the-chain-is-shaped-this-way"
    assert slug("`GET /v1/sessions/{session_id}/tree`") == "get-v1sessionssession_idtree"


@pytest.mark.parametrize("name", ["README.md", *GUIDES])
def test_links_resolve(name):
    path = REPO / name if name == "README.md" else DOCS / name
    text = re.sub(_FENCE, "", path.read_text())
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part) if file_part else path
        if not linked.exists():
            assert linked.name in LINKED_ELSEWHERE, f"{name}: link to a missing file: {target}"
            continue
        if anchor and linked.suffix == ".md":
            assert anchor in anchors(linked), f"{name}: no heading for {target}"


# ---- JSON examples are JSON ------------------------------------------------------------------------


@pytest.mark.parametrize("name", GUIDES)
def test_json_examples_parse(name):
    for lang, body in code_blocks((DOCS / name).read_text()):
        if lang == "json":
            json.loads(body)  # shortened examples elide with "…" strings, never with bare text


# ---- the tests the docs cite exist ----------------------------------------------------------------


@pytest.mark.parametrize("name", GUIDES)
def test_cited_tests_exist(name):
    text = (DOCS / name).read_text()
    for module, function in re.findall(r"((?:\w+/)*test_\w+\.py)::(test_\w+)", text):
        paths = [p for p in (REPO / "tests").rglob("test_*.py") if p.as_posix().endswith("/" + module)]
        assert paths, f"{name} cites a missing test module {module}"
        assert any(re.search(rf"^def {function}\(", p.read_text(), re.MULTILINE) for p in paths), (
            f"{name} cites {module}::{function}"
        )


# ---- the quickstart's curl examples work against a real chain -------------------------------------


def parse_curl(line: str) -> dict:
    tokens = shlex.split(line)
    assert tokens[0] == "curl"
    request = {"method": None, "headers": {}, "data": None, "stream": False, "url": None}
    i = 1
    while i < len(tokens):
        token = tokens[i]
        if token in ("-H", "--header"):
            name, _, value = tokens[i + 1].partition(":")
            request["headers"][name.strip()] = value.strip()
            i += 2
        elif token in ("-d", "--data", "--data-raw"):
            request["data"] = tokens[i + 1]
            i += 2
        elif token in ("-X", "--request"):
            request["method"] = tokens[i + 1]
            i += 2
        elif token.startswith("-"):
            request["stream"] |= token == "--no-buffer" or (not token.startswith("--") and "N" in token)
            i += 1
        else:
            request["url"] = token
            i += 1
    request["method"] = request["method"] or ("POST" if request["data"] is not None else "GET")
    return request


def quickstart_curls() -> list[str]:
    curls = []
    for lang, body in code_blocks((DOCS / "quickstart.md").read_text()):
        if lang in SHELL_LANGS:
            curls += [line for line in command_lines(body) if line.startswith("curl ")]
    return curls


def test_curl_parsing():
    request = parse_curl("curl -sN 'http://h/v1/x?a=1' -H 'x-session-id: s' -d '{\"a\": 1}'")
    assert request == {
        "method": "POST",
        "headers": {"x-session-id": "s"},
        "data": '{"a": 1}',
        "stream": True,
        "url": "http://h/v1/x?a=1",
    }


@pytest.mark.integration
def test_quickstart_curl_examples_work_against_a_real_chain(chain):
    curls = [parse_curl(line) for line in quickstart_curls()]
    ours = [c for c in curls if c["url"].startswith(DOC_BASE + "/")]
    assert len(ours) >= 8, "the quickstart lost its curl examples"
    with httpx.Client(timeout=60) as client:
        for c in ours:
            url = chain.url + c["url"][len(DOC_BASE) :]
            # Run the JSON body through a JSON parser: a broken example body fails here, not at the server.
            body = json.loads(c["data"]) if c["data"] is not None else None
            if c["stream"]:
                with client.stream(c["method"], url, json=body, headers=c["headers"]) as response:
                    assert response.status_code == 200, (c["url"], response.read())
                    lines = [line for line in response.iter_lines() if line.startswith("data: ")]
                assert lines and lines[-1] == "data: [DONE]", (c["url"], lines[-3:])
                continue
            response = client.request(c["method"], url, json=body, headers=c["headers"])
            assert response.status_code == 200, (c["url"], response.text)
            reply = response.json()
            if url.endswith("/completions"):
                assert reply["completions"] and all(r["is_valid"] for r in reply["completions"]), c["url"]
            if url.endswith("/rollout"):
                assert reply["partial_reason"] is None and reply["mask_sample"] is False, c["url"]
                assert any("generation_token_ids" in item for item in reply["output"]), c["url"]
            if url.endswith("/v1/responses"):
                assert reply["status"] == "completed" and reply["output"], c["url"]


# ---- the module map names exactly the modules that exist ------------------------------------------


def test_module_map_names_every_module_and_no_other():
    text = (DOCS / "architecture.md").read_text()
    section = text.split("## Module map", 1)[1].split("\n## ", 1)[0]
    mapped = set(re.findall(r"^\| `((?:server|middleware)/[\w/]+\.py)` \|", section, re.MULTILINE))
    existing = {
        path.relative_to(REPO).as_posix()
        for folder in ("server", "middleware")
        for path in (REPO / folder).rglob("*.py")
        if path.name != "__init__.py"
    }
    assert not existing - mapped, f"modules missing from docs/architecture.md's map: {sorted(existing - mapped)}"
    assert not mapped - existing, f"the map names modules that do not exist: {sorted(mapped - existing)}"
