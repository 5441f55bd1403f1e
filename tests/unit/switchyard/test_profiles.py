"""Deployment profiles: rendering privately for Switchyard, and the shipped profiles."""

from __future__ import annotations

import os
import stat
import tempfile
import tomllib

import pytest

from server.config import PROFILES_DIR, ConfigError, load_settings, resolve_deployment
from server.switchyard import discovery, interpolation, profiles
from tests.support.deployments import PROFILE_ENV, SECRET
from tests.support.procs import dead_and_living_dirs


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


def test_a_killed_servers_private_rendering_is_removed_by_the_next_one_and_a_live_ones_is_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    orphan, living = dead_and_living_dirs(tmp_path, profiles.PRIVATE_DIR_PREFIX)
    path = tmp_path / "d.toml"
    path.write_text('a = "${V}"\n')
    private = profiles.write_private(profiles.render(path, {"V": SECRET}))
    try:
        assert not orphan.exists() and living.exists()
        assert private.parent.name.startswith(f"{profiles.PRIVATE_DIR_PREFIX}{os.getpid()}-")
    finally:
        profiles.remove_private(private)


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
    variables = interpolation.yaml_references(text) if path.suffix == ".yaml" else interpolation.references(text, path)
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
    [upstream] = discovery.route_upstreams(profiles.render(PROFILES_DIR / "vllm.toml").text)
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
