"""`GET /v1/models` in Anthropic's shape, checked against the anthropic SDK's own model type."""

from __future__ import annotations

import pydantic
import pytest

anthropic = pytest.importorskip("anthropic")
from anthropic.types import ModelInfo  # noqa: E402


def test_every_field_the_sdks_model_type_declares_is_there_and_valid(chain):
    client = anthropic.Anthropic(base_url=chain.url, api_key="dummy")
    page = client.models.list()
    raw = client.models.with_raw_response.list().http_response.json()
    assert [model.id for model in page.data] == [entry["id"] for entry in raw["data"]] and raw["data"]
    for entry in raw["data"]:
        assert set(entry) == set(ModelInfo.model_fields), set(ModelInfo.model_fields) ^ set(entry)
        info = ModelInfo.model_validate(entry)  # validated, not merely constructed
        assert info.lifecycle == "active" and info.type == "model"
        assert info.max_input_tokens is not None and info.max_input_tokens > 0


def test_the_check_fails_without_a_declared_field():
    """Negative control: the SDK's type does refuse an entry lacking `lifecycle` (what 2.17 added)."""
    entry = {"type": "model", "id": "m", "display_name": "m", "created_at": "1970-01-01T00:00:00Z"}
    with pytest.raises(pydantic.ValidationError):
        ModelInfo.model_validate(entry)
    ModelInfo.model_validate({**entry, "lifecycle": "active"})
