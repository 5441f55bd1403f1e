"""The in-process mock app every test here talks to."""

from __future__ import annotations

import pytest

from tests.support.mock_chat import AppClient


@pytest.fixture()
def app() -> AppClient:
    return AppClient()
