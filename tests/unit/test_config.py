"""Settings: Gym field names, source precedence, validation."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from server.config import PROFILES_DIR, ConfigError, load_settings, resolve_deployment


def write(tmp_path: Path, text: str, name: str = "cfg.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_neither_deployment_nor_base_url_is_an_error_naming_both():
    with pytest.raises(ConfigError) as err:
        load_settings(environ={})
    assert "deployment" in str(err.value) and "switchyard_base_url" in str(err.value)


def test_deployment_alone_launches_and_base_url_alone_attaches():
    launched = load_settings(overrides={"deployment": "demo"}, environ={})
    assert launched.launches_proxy and launched.mode == "launch-hosted"
    attached = load_settings(overrides={"switchyard_base_url": "http://127.0.0.1:4000/v1"}, environ={})
    assert not attached.launches_proxy and attached.mode == "attach"
    process = load_settings(overrides={"deployment": "demo", "switchyard_command": "x {deployment} {port}"}, environ={})
    assert process.mode == "launch-process"


def test_both_set_attaches_and_warns(caplog):
    with caplog.at_level(logging.WARNING):
        settings = load_settings(
            overrides={"deployment": "demo", "switchyard_base_url": "http://127.0.0.1:1/v1"}, environ={}
        )
    assert settings.mode == "attach"
    assert "both switchyard_base_url and deployment are set" in caplog.text


def test_precedence_defaults_yaml_env_flags(tmp_path):
    cfg = write(tmp_path, "switchyard_model: from-yaml\nswitchyard_base_url: http://yaml:1/v1\nport: 9001\n")
    settings = load_settings(cfg, environ={})
    assert (settings.switchyard_model, settings.switchyard_base_url, settings.port) == (
        "from-yaml",
        "http://yaml:1/v1",
        9001,
    )
    assert settings.host == "127.0.0.1"  # default binds loopback
    settings = load_settings(cfg, environ={"SWITCHYARD_BASE_URL": "http://env:2/v1"})
    assert settings.switchyard_base_url == "http://env:2/v1"
    settings = load_settings(
        cfg,
        {"switchyard_base_url": "http://flag:3/v1", "port": None},
        environ={"SWITCHYARD_BASE_URL": "http://env:2/v1"},
    )
    assert settings.switchyard_base_url == "http://flag:3/v1"
    assert settings.port == 9001  # an unset flag does not override


def test_gym_shaped_yaml_with_oc_env_interpolation(tmp_path):
    cfg = write(
        tmp_path,
        """
policy_model:
  responses_api_models:
    switchyard_model:
      entrypoint: app.py
      switchyard_base_url: ${oc.env:SWITCHYARD_BASE_URL,null}
      switchyard_api_key: ${oc.env:SWITCHYARD_API_KEY,dummy}
      switchyard_model: policy-model
      deployment: ${oc.env:SWITCHYARD_DEPLOYMENT,null}
      session_id_headers: [x-switchyard-session-id, proxy_x_session_id]
      extra_body: {max_output_tokens: 16}
      max_concurrent_requests: 4
""",
    )
    settings = load_settings(cfg, environ={"SWITCHYARD_DEPLOYMENT": "demo"})
    assert settings.switchyard_model == "policy-model"
    assert settings.switchyard_api_key == "dummy"
    assert settings.deployment == "demo" and settings.switchyard_base_url is None
    assert settings.session_id_headers == ["x-switchyard-session-id", "proxy_x_session_id"]
    assert settings.extra_body == {"max_output_tokens": 16}
    assert settings.max_concurrent_requests == 4


def test_gyms_own_switchyard_model_yaml_loads_unchanged(tmp_path):
    """Gym 0.7.0's shipped block (its keys and values), with the base model-server keys Gym adds."""
    cfg = write(
        tmp_path,
        """
policy_model:
  responses_api_models:
    switchyard_model:
      entrypoint: app.py
      deployment: ${oc.env:SWITCHYARD_DEPLOYMENT,null}
      switchyard_model: policy
      switchyard_base_url: ${oc.env:SWITCHYARD_BASE_URL,null}
      switchyard_api_key: ${oc.env:SWITCHYARD_API_KEY,dummy}
      proxy_port: null
      session_id_headers:
        - x-switchyard-session-id
      condition_dir: ${oc.env:SWITCHYARD_CONDITION_DIR,null}
      proxy_provenance: {switchyard_commit: abc}
      extra_body: {}
      default_headers: {}
      max_concurrent_requests: null
      token_id_capture_non_generating_requests: [{method: GET, path: /custom/metadata}]
      num_workers: 1
""",
    )
    settings = load_settings(cfg, environ={"SWITCHYARD_BASE_URL": "http://127.0.0.1:4000/v1"})
    assert settings.proxy_provenance == {"switchyard_commit": "abc"} and settings.workers == 1


@pytest.mark.parametrize("attach, expected", [(True, 3), (False, "cannot host the proxy with num_workers > 1")])
def test_num_workers_has_gyms_meaning(tmp_path, attach, expected):
    """Gym's num_workers: worker processes when attached; refused when hosting (each would host a proxy)."""
    where = "switchyard_base_url: http://127.0.0.1:4000/v1" if attach else "deployment: demo"
    cfg = write(tmp_path, f"switchyard_model: policy\n{where}\nnum_workers: 3\n")
    if attach:
        assert load_settings(cfg).workers == expected
    else:
        with pytest.raises(ConfigError, match=str(expected)):
            load_settings(cfg)


def test_unknown_field_and_bad_values_are_one_line_errors(tmp_path):
    with pytest.raises(ConfigError, match="swtchyard_model"):
        load_settings(write(tmp_path, "deployment: demo\nswtchyard_model: x\n"), environ={})
    with pytest.raises(ConfigError, match="max_concurrent_requests"):
        load_settings(overrides={"deployment": "demo", "max_concurrent_requests": 0}, environ={})
    with pytest.raises(ConfigError, match="not a valid header name"):
        load_settings(overrides={"deployment": "demo", "session_id_headers": ["bad header\r\n"]}, environ={})
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_settings(write(tmp_path, "a: [\n"), environ={})


def test_profile_names_resolve_to_shipped_files(tmp_path):
    assert resolve_deployment("demo") == PROFILES_DIR / "demo.toml"
    own = write(tmp_path, "schema_version = 1\n", "mine.toml")
    assert resolve_deployment(str(own)) == own.resolve()
    with pytest.raises(ConfigError, match="not found"):
        resolve_deployment("no-such-profile")


# ---- token injection -------------------------------------------------------------------------


def test_token_injection_in_attach_mode_names_the_missing_tokenize_url():
    with pytest.raises(ConfigError, match="injection_tokenize_base_url"):
        load_settings(overrides={"switchyard_base_url": "http://127.0.0.1:9/v1", "token_injection": True}, environ={})
    settings = load_settings(
        overrides={
            "switchyard_base_url": "http://127.0.0.1:9/v1",
            "token_injection": True,
            "injection_tokenize_base_url": "http://127.0.0.1:8000",
        },
        environ={},
    )
    assert settings.token_injection and settings.injection_transport == "vllm"
    # NeMo-RL's engine renders the template itself and splices its tail: nothing to tokenize here.
    attached = {"switchyard_base_url": "http://127.0.0.1:9/v1", "token_injection": True}
    nemo_rl = load_settings(overrides={**attached, "injection_transport": "nemo_rl"}, environ={})
    assert nemo_rl.injection_tokenize_base_url is None


def test_token_injection_in_launch_mode_needs_no_tokenize_url():
    assert load_settings(overrides={"deployment": "demo", "token_injection": True}, environ={}).token_injection


def test_token_injection_needs_capture():
    with pytest.raises(ConfigError, match="capture"):
        load_settings(overrides={"deployment": "demo", "token_injection": True, "capture": False}, environ={})


def test_unknown_injection_transport_is_refused():
    with pytest.raises(ConfigError, match="injection_transport"):
        load_settings(overrides={"deployment": "demo", "injection_transport": "grpc"}, environ={})
