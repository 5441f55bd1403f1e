"""What the shipped deployment profiles need from the environment, for tests that render or check them."""

from __future__ import annotations

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
