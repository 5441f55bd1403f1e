"""submit_rollout's task body without a cluster: settings are checked on the node, and failures are results."""

from __future__ import annotations

import sys

from server import ray_tasks


def test_settings_that_do_not_validate_on_the_node_come_back_as_an_error_result(tmp_path):
    called = []
    outcome = ray_tasks.run_rollout(
        lambda base_url: called.append(base_url),
        [],
        {"deployment": "demo", "upstream_timeout_s": -1},
        str(tmp_path),
        None,
    )
    assert called == []  # the agent never ran
    assert outcome["result"] is None and outcome["rollouts"] == []
    assert (
        outcome["errors"][0].startswith("server settings: ConfigError") and "upstream_timeout_s" in outcome["errors"][0]
    )


def test_the_task_defaults_are_the_production_ones():
    options = {**ray_tasks.DEFAULT_OPTIONS}
    assert options == {"scheduling_strategy": "SPREAD", "num_cpus": 0.1, "max_retries": 0}
    assert sys.executable  # runtime_env={"py_executable": sys.executable} is added per call
