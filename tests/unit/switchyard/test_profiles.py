"""Deployment profiles: string-only interpolation, the shipped profiles, and `profiles list/show/check`."""

from __future__ import annotations

import argparse
import asyncio
import stat
import tomllib
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.cli.profiles import add_profiles_parser
from server.config import PROFILES_DIR, ConfigError, load_settings, resolve_deployment
from server.switchyard import profiles

SECRET = "sk-sentinel-0123456789abcdef"

# What each shipped profile needs to pass `profiles check`.
PROFILE_ENV = {
    "demo": {},
    "vllm": {"VLLM_MODEL": "Qwen/Qwen3-8B"},
    "router": {
        "EFFICIENT_MODEL": "small-model",
        "CAPABLE_MODEL": "big-model",
        "EFFICIENT_API_KEY": SECRET,
        "CAPABLE_API_KEY": SECRET + "-capable",
    },
    "gym": {"SWITCHYARD_DEPLOYMENT": "vllm", "VLLM_MODEL": "Qwen/Qwen3-8B"},
}
ALL_PROFILE_VARS = {name for env in PROFILE_ENV.values() for name in env} | {
    "SWITCHYARD_BASE_URL",
    "SWITCHYARD_MODEL",
    "SWITCHYARD_API_KEY",
    "SWITCHYARD_CONDITION_DIR",
    "VLLM_BASE_URL",
    "EFFICIENT_BASE_URL",
    "CAPABLE_BASE_URL",
    "MOCK_UPSTREAM_URL",
}


@pytest.fixture
def clean_env(monkeypatch):
    for name in ALL_PROFILE_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def interp(text: str, env: dict[str, str], path: str = "deploy.toml") -> str:
    return profiles.interpolate(text, Path(path), env)[0]


def cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="switchyard-model")
    add_profiles_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["profiles", *argv])
    return args.func(args)


# ---- interpolation ------------------------------------------------------------------------


def test_variables_are_replaced_inside_strings_only():
    text = (
        "# a comment mentioning ${HOST} stays as written\n"
        'url = "http://${HOST}/v1"  # and ${HOST} here too\n'
        "window = ${WINDOW}\n"
        "name = '${HOST}'\n"
    )
    out = interp(text, {"HOST": "h:1", "WINDOW": "9"})
    assert out == (
        "# a comment mentioning ${HOST} stays as written\n"
        'url = "http://h:1/v1"  # and ${HOST} here too\n'
        "window = ${WINDOW}\n"
        "name = 'h:1'\n"
    )


def test_a_hash_or_escaped_quote_inside_a_string_does_not_end_it():
    text = 'a = "x#${A}"\nb = "say \\"${B}\\" ok"\n'
    doc = tomllib.loads(interp(text, {"A": "1", "B": "2"}))
    assert doc == {"a": "x#1", "b": 'say "2" ok'}


def test_default_applies_when_unset_or_empty_but_not_when_set():
    text = 'a = "${A:-dflt}"\nb = "${B:-dflt}"\nc = "${C:-dflt}"\nd = "${D:-}"\ne = "${E}"\n'
    doc = tomllib.loads(interp(text, {"B": "", "C": "given", "E": ""}))
    # `:-` treats set-but-empty like unset (shell semantics); plain ${E} keeps the empty value.
    assert doc == {"a": "dflt", "b": "dflt", "c": "given", "d": "", "e": ""}


def test_values_are_escaped_for_the_string_they_land_in():
    value = 'quote " backslash \\ newline \n tab \t bell \x07 end'
    text = 'a = "${V}"\nb = """\nmulti ${V}"""\n'
    doc = tomllib.loads(interp(text, {"V": value}))
    assert doc["a"] == value
    assert doc["b"] == "multi " + value


@settings(max_examples=200, deadline=None)
@given(st.text(st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_any_value_round_trips_through_a_basic_string(value):
    assert tomllib.loads(interp('k = "${V}"\n', {"V": value}))["k"] == value


def test_a_literal_string_cannot_take_a_quote_and_says_where():
    with pytest.raises(ConfigError) as err:
        interp("\n\nname = 'x${V}'\n", {"V": "it's"}, path="/etc/d.toml")
    assert "/etc/d.toml:3" in str(err.value) and "V" in str(err.value)


def test_unset_variable_names_the_variable_the_file_and_the_line():
    text = 'a = """\nline one\nline two"""\n# ${NOT_THIS_ONE}\nurl = "http://${HOST}/v1"\n'
    with pytest.raises(ConfigError) as err:
        interp(text, {}, path="/work/dep.toml")
    message = str(err.value)
    assert message.startswith("/work/dep.toml:5: variable HOST is not set")
    assert "NOT_THIS_ONE" not in message


def test_unset_variable_in_a_multiline_string_reports_its_own_line():
    with pytest.raises(ConfigError, match=r"d.toml:3: variable X"):
        interp('a = """\none\ntwo ${X}"""\n', {}, path="d.toml")


def test_multiline_string_may_end_with_quotes():
    doc = tomllib.loads(interp('a = """say "${V}"""""\n', {"V": "hi"}))
    assert doc["a"] == 'say "hi""'


def test_unterminated_string_is_an_error_with_its_line():
    with pytest.raises(ConfigError, match=r"d.toml:2: unterminated string"):
        interp('a = "ok"\nb = "open\nc = "x"\n', {}, path="d.toml")


def test_render_records_values_and_hides_secret_ones(tmp_path):
    path = tmp_path / "d.toml"
    # A secret variable under an innocent key: only the variable's name says it is secret.
    path.write_text('a = "${HOST}"\nh = { "x-team" = "${TEAM_TOKEN}" }\napi_key = "literal-key"\n')
    rendered = profiles.render(path, {"HOST": "h1", "TEAM_TOKEN": SECRET})
    assert rendered.variables == {"HOST": "h1", "TEAM_TOKEN": SECRET}
    assert SECRET in rendered.text  # Switchyard needs the real value
    assert SECRET not in rendered.redacted_text and "literal-key" not in rendered.redacted_text
    assert 'a = "h1"' in rendered.redacted_text and "<redacted>" in rendered.redacted_text
    assert rendered.scrub(f"line: {SECRET}") == "line: <redacted>"


def test_private_rendering_is_0600_in_a_0700_dir_and_removed(tmp_path):
    path = tmp_path / "d.toml"
    path.write_text('a = "${V}"\n')
    private = profiles.write_private(profiles.render(path, {"V": SECRET}))
    try:
        assert stat.S_IMODE(private.stat().st_mode) == 0o600
        assert stat.S_IMODE(private.parent.stat().st_mode) == 0o700
        assert SECRET in private.read_text()
    finally:
        profiles.remove_private(private)
    assert not private.exists() and not private.parent.exists()


def test_references_list_string_variables_with_defaults_and_lines():
    text = '# ${IN_COMMENT}\nurl = "${URL:-http://x/v1}"\nmodel = "${MODEL}"\nn = ${NUMBER}\n'
    found = profiles.references(text, Path("d.toml"))
    assert [(v.name, v.default, v.line, v.required) for v in found] == [
        ("URL", "http://x/v1", 2, False),
        ("MODEL", None, 3, True),
    ]


def test_credential_assignments_are_redacted_but_names_and_references_kept():
    text = (
        'api_key = "sk-live"\napi_key_env = "OPENAI_API_KEY"\nextra_headers = { "x-api-token" = "t0k" }\n'
        'other_key = "${SOME_KEY}"\nbase_url = "http://x"\n'
    )
    out = profiles.redact_assignments(text)
    assert "sk-live" not in out and "t0k" not in out
    assert 'api_key_env = "OPENAI_API_KEY"' in out and '"${SOME_KEY}"' in out and 'base_url = "http://x"' in out
    yaml_out = profiles.redact_assignments(
        "a:\n  switchyard_api_key: my secret key\n  other_api_key: ${oc.env:K,dummy}\n", yaml=True
    )
    assert "my secret key" not in yaml_out and "${oc.env:K,dummy}" in yaml_out


# ---- shipped profiles ---------------------------------------------------------------------


def test_profile_names_resolve_to_shipped_files():
    for name in ("demo", "vllm", "router"):
        assert resolve_deployment(name) == PROFILES_DIR / f"{name}.toml"
        assert profiles.resolve_profile(name) == PROFILES_DIR / f"{name}.toml"
    assert profiles.resolve_profile("gym") == PROFILES_DIR / "gym.yaml"
    assert {p.stem for p in profiles.shipped_profiles()} >= set(PROFILE_ENV)
    with pytest.raises(ConfigError, match="neither a file nor a shipped profile"):
        profiles.resolve_profile("no-such-profile")


@pytest.mark.parametrize("name", ["demo", "vllm", "router", "gym"])
def test_every_shipped_profile_has_a_header_naming_its_variables(name):
    path = profiles.resolve_profile(name)
    text = path.read_text()
    assert text.startswith(f"# {path.name}: ")
    header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
    variables = profiles.yaml_references(text) if path.suffix == ".yaml" else profiles.references(text, path)
    for var in variables:
        assert var.name in header, f"{path.name} reads {var.name} but its header does not say so"
    if path.suffix == ".toml":
        for name_read_by_switchyard in profiles.api_key_envs(text):
            assert name_read_by_switchyard in header


def test_vllm_profile_leaves_token_ids_to_this_server(clean_env):
    clean_env.setenv("VLLM_MODEL", "m")
    doc = tomllib.loads(profiles.render(PROFILES_DIR / "vllm.toml").text)
    assert doc["llm_clients"]["vllm"]["format"] == "openai_chat"
    assert doc["llm_clients"]["vllm"]["timeout_ms"] > 0
    assert doc["llm_clients"]["vllm"]["base_url"] == "http://127.0.0.1:8000/v1"
    assert "extra_body" not in doc["targets"]["policy"]
    assert doc["routes"]["policy"]["id"] == "policy" and isinstance(doc["routes"]["policy"]["context_window"], int)
    [upstream] = profiles.route_upstreams(profiles.render(PROFILES_DIR / "vllm.toml").text)
    assert (upstream.route_id, upstream.base_url, upstream.model) == ("policy", "http://127.0.0.1:8000/v1", "m")


def test_router_profile_reads_keys_by_name_only(clean_env):
    text = (PROFILES_DIR / "router.toml").read_text()
    assert profiles.api_key_envs(text) == ["EFFICIENT_API_KEY", "CAPABLE_API_KEY"]
    assert "api_key =" not in text


def test_gym_yaml_loads_as_gym_shaped_settings(clean_env, tmp_path):
    clean_env.setenv("SWITCHYARD_DEPLOYMENT", "router")
    clean_env.setenv("SWITCHYARD_CONDITION_DIR", str(tmp_path))
    settings = load_settings(PROFILES_DIR / "gym.yaml")
    assert settings.deployment == "router" and settings.launches_proxy
    assert settings.switchyard_model is None and settings.switchyard_api_key == "dummy"
    assert settings.condition_dir == str(tmp_path)
    assert settings.session_id_headers == ["x-switchyard-session-id"]
    clean_env.delenv("SWITCHYARD_DEPLOYMENT")
    clean_env.setenv("SWITCHYARD_BASE_URL", "http://127.0.0.1:4000/v1")
    assert load_settings(PROFILES_DIR / "gym.yaml").mode == "attach"


# ---- profiles list / show -----------------------------------------------------------------


def test_list_prints_name_path_and_first_header_line(capsys):
    assert cli("list") == 0
    out = capsys.readouterr().out.splitlines()
    for path in profiles.shipped_profiles():
        first = path.read_text().splitlines()[0].removeprefix(f"# {path.name}:").strip()
        [row] = [line for line in out if line.split()[0] == path.stem]
        assert path.name in row and row.endswith(first)


def test_show_prints_the_file_and_its_variables_with_defaults(clean_env, capsys):
    clean_env.setenv("VLLM_BASE_URL", "http://10.0.0.5:8000/v1")
    assert cli("show", "vllm") == 0
    out = capsys.readouterr().out
    assert (PROFILES_DIR / "vllm.toml").read_text() in out
    variables = out.split("\nVariables:")[1]
    assert "VLLM_BASE_URL" in variables and "default 'http://127.0.0.1:8000/v1'" in variables
    assert "set: http://10.0.0.5:8000/v1" in variables
    vllm_model = next(line for line in variables.splitlines() if "VLLM_MODEL" in line)
    assert "required" in vllm_model and "unset" in vllm_model


def test_show_gym_lists_oc_env_variables(clean_env, capsys):
    assert cli("show", "gym") == 0
    variables = capsys.readouterr().out.split("\nVariables:")[1]
    for name in ("SWITCHYARD_DEPLOYMENT", "SWITCHYARD_BASE_URL", "SWITCHYARD_MODEL", "SWITCHYARD_CONDITION_DIR"):
        assert name in variables
    assert "default 'dummy'" in variables


def test_show_never_prints_secret_values(clean_env, capsys, tmp_path):
    for name, value in PROFILE_ENV["router"].items():
        clean_env.setenv(name, value)
    clean_env.setenv("TEAM_TOKEN", SECRET + "-team")
    custom = tmp_path / "custom.toml"
    custom.write_text('schema_version = 1\napi_key = "sk-literal-in-file"\nh = { "x-team-token" = "${TEAM_TOKEN}" }\n')
    assert cli("show", "router") == 0
    assert cli("show", str(custom)) == 0
    out = capsys.readouterr()
    assert SECRET not in out.out + out.err and "sk-literal-in-file" not in out.out
    assert "EFFICIENT_API_KEY  (set)" in out.out
    assert "TEAM_TOKEN" in out.out and "(set)" in out.out


def test_show_unknown_profile_is_a_usage_error(capsys):
    assert cli("show", "no-such-profile") == 2
    assert "no-such-profile" in capsys.readouterr().err


# ---- profiles check (real Switchyard) -------------------------------------------------------


@pytest.mark.parametrize("name", ["demo", "vllm", "router", "gym"])
def test_every_shipped_profile_passes_check(name, clean_env, capsys):
    for var, value in PROFILE_ENV[name].items():
        clean_env.setenv(var, value)
    assert cli("check", name) == 0, capsys.readouterr().err
    out = capsys.readouterr()
    assert "routes:" in out.out
    assert SECRET not in out.out + out.err
    expected = {
        "demo": ("demo", "32768"),
        "vllm": ("policy", "32768"),
        "router": ("router", "128000"),
        "gym": ("policy", "32768"),
    }[name]
    default_row = next(line for line in out.out.splitlines() if "(default)" in line)
    assert default_row.split()[0] == expected[0] and f"context_window={expected[1]}" in default_row


def test_router_check_lists_all_routes(clean_env, capsys):
    for var, value in PROFILE_ENV["router"].items():
        clean_env.setenv(var, value)
    assert cli("check", "router") == 0
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    assert rows == ["router", "router/capable", "router/efficient", "router/split"]


def test_check_closes_switchyard_and_removes_the_private_copy(clean_env, monkeypatch, capsys):
    import switchyard_rust.server as native

    real_server, seen, written = native.Server, [], []
    real_write = profiles.write_private

    def recording_server(*args, **kwargs):
        server = real_server(*args, **kwargs)
        seen.append((server, kwargs.get("port")))  # held, so only close() can stop it
        return server

    def recording_write(rendered):
        written.append(real_write(rendered))
        return written[-1]

    monkeypatch.setattr(native, "Server", recording_server)
    monkeypatch.setattr(profiles, "write_private", recording_write)
    clean_env.setenv("VLLM_MODEL", "m")
    assert cli("check", "vllm") == 0
    [(server, port)] = seen
    try:
        assert port == 0
        with pytest.raises(httpx.ConnectError):
            httpx.get(server.base_url + "/health", timeout=2.0, trust_env=False)
        assert written and not written[0].exists()
    finally:
        server.close(timeout_secs=2.0)


def test_check_unset_variable_exits_2_naming_it(clean_env, capsys):
    assert cli("check", "vllm") == 2
    err = capsys.readouterr().err
    assert "VLLM_MODEL" in err and f"{PROFILES_DIR / 'vllm.toml'}:" in err


def test_check_invalid_deployment_prints_switchyards_message_once(tmp_path, capsys):
    path = tmp_path / "bad.toml"
    path.write_text('schema_version = 1\n[targets]\n[routes.r]\nid = "r"\ntype = "fancy"\n')
    assert cli("check", str(path)) == 2
    err = capsys.readouterr().err
    assert "unknown variant `fancy`" in err
    assert err.count("unknown variant `fancy`") == 1  # Switchyard repeats it; we do not
    assert str(path) in err and "switchyard-model-" not in err  # the user's file, not the private copy


def test_check_reports_switchyards_own_variable_requirement(clean_env, capsys):
    for var, value in PROFILE_ENV["router"].items():
        clean_env.setenv(var, value)
    clean_env.delenv("CAPABLE_API_KEY")
    assert cli("check", "router") == 2
    err = capsys.readouterr().err
    assert "CAPABLE_API_KEY" in err and SECRET not in err


def test_check_hides_secrets_that_switchyard_quotes_back(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TEAM_TOKEN", SECRET)
    path = tmp_path / "leaky.toml"
    path.write_text(
        'schema_version = 1\n[llm_clients.c]\nformat = "openai_chat"\nbase_url = "http://127.0.0.1:9/v1"\n'
        'extra_headers = { "x-team-token" = "${TEAM_TOKEN}" ]\n[targets]\n[routes]\n'
    )
    assert cli("check", str(path)) == 2
    err = capsys.readouterr().err
    assert "TOML parse error" in err  # Switchyard quoted the offending line ...
    assert SECRET not in err and "<redacted>" in err  # ... without the secret


def test_check_gym_settings_with_an_unknown_route_exits_2(clean_env, capsys):
    for var, value in PROFILE_ENV["gym"].items():
        clean_env.setenv(var, value)
    clean_env.setenv("SWITCHYARD_MODEL", "nope")
    assert cli("check", "gym") == 2
    assert "'nope' is not in the deployment" in capsys.readouterr().err


def test_check_gym_settings_in_attach_mode_does_not_contact_anything(clean_env, capsys):
    clean_env.setenv("SWITCHYARD_BASE_URL", "http://127.0.0.1:9/v1")
    assert cli("check", "gym") == 0
    assert "attach" in capsys.readouterr().out


def test_check_gym_settings_without_a_switchyard_exits_2(clean_env, capsys):
    assert cli("check", "gym") == 2
    assert "deployment" in capsys.readouterr().err


def test_check_missing_file_exits_2(tmp_path, capsys):
    assert cli("check", str(tmp_path / "missing.toml")) == 2


def test_check_without_the_native_wheel_exits_1(monkeypatch, clean_env, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "switchyard_rust.server", None)
    clean_env.setenv("VLLM_MODEL", "m")
    assert cli("check", "vllm") == 1
    assert "nemo-switchyard" in capsys.readouterr().err


# ---- max_model_len discovery ----------------------------------------------------------------


def _discover(handler, base_url: str = "http://vllm.test/v1", model: str = "m") -> int | None:
    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await profiles.discover_max_model_len(base_url, model, client)

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
        async with httpx.AsyncClient(trust_env=False) as client:
            return await profiles.discover_max_model_len(f"http://127.0.0.1:{free_port()}/v1", "m", client)

    assert asyncio.run(go()) is None
    assert "max_model_len" in caplog.text
