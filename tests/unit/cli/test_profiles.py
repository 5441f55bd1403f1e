"""`switchyard-model profiles list / show / check` (check loads each deployment into the real Switchyard)."""

from __future__ import annotations

import argparse

import httpx
import pytest

from server.cli.profiles import add_profiles_parser
from server.config import PROFILES_DIR
from server.switchyard import profiles
from tests.support.deployments import PROFILE_ENV, SECRET


def cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="switchyard-model")
    add_profiles_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["profiles", *argv])
    return args.func(args)


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
            httpx.get(server.base_url + "/health", timeout=2.0)
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
