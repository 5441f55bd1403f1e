"""The model Switchyard says answered (`x-model-router-selected-model`) names the call in spans and metrics."""

from __future__ import annotations

import pytest

from middleware.correlation import Correlation
from tests.support.telemetry import REQUEST, RESPONSE, metric_points, scope, split

ROUTE_ANSWER = {**RESPONSE, "model": "demo"}  # an answer that names the route, not the model


@pytest.mark.parametrize("header, shown", [("mock-model", "mock-model"), (None, "demo")], ids=["said", "unsaid"])
def test_switchyards_header_outranks_an_answer_naming_the_route(traced, header, shown):
    """`unsaid` is the negative control: without the header the answer's own `model` stays."""
    tel, exporter, reader = traced
    span = tel.start_call(
        api="responses", route="demo", request=REQUEST, correlation=Correlation(), stream=False, scope=scope()
    )
    span.answered_by(header)
    span.finish(ROUTE_ANSWER)
    _, client = split(exporter.get_finished_spans())
    assert client.attributes["llm.model_name"] == client.attributes["gen_ai.response.model"] == shown
    assert client.attributes["gen_ai.request.model"] == "demo"
    (point,) = metric_points(reader, "gen_ai.client.operation.duration")
    assert point.attributes["gen_ai.response.model"] == shown
    assert ROUTE_ANSWER["model"] == "demo"  # the caller's answer is left as it was


def test_an_empty_header_is_no_answer(traced):
    tel, exporter, _ = traced
    span = tel.start_call(
        api="chat", route="demo", request=REQUEST, correlation=Correlation(), stream=False, scope=scope()
    )
    span.answered_by("")
    span.finish(ROUTE_ANSWER)
    _, client = split(exporter.get_finished_spans())
    assert client.attributes["llm.model_name"] == "demo"
