"""A server per rollout on a real two-node Ray cluster (every Ray process on 127.0.0.1), unmocked.

The rollout tasks run with the production defaults of `submit_rollout` (SPREAD, num_cpus=0.1,
max_retries=0, py_executable), settings cross as plain data, each task starts its own server,
and the rollouts come back through the object store.
"""

from __future__ import annotations

import os

import psutil
import pytest

from server.capture.catalog.sessions import build_rollout
from server.capture.store import CaptureStore
from tests.support import scripted_agent

# Before Ray is imported (it reads them then): keep every Ray process on loopback, and let nothing of
# Ray's reach out. Without the first, Ray binds and dials the machine's interface address.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"

import ray  # noqa: E402  (the [ray] extra; `make test` installs it)
from ray.cluster_utils import Cluster  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

from server.ray_tasks import get_rollouts, submit_rollout  # noqa: E402
from tests.support.procs import wait_for

LOOPBACK = "127.0.0.1"


@pytest.fixture(scope="module")
def cluster():
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False, "node_ip_address": LOOPBACK},
    )
    cluster.add_node(num_cpus=1, node_ip_address=LOOPBACK)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, _node_ip_address=LOOPBACK, logging_level="warning")
    # The scripted agent travels by value: Ray's workers need not find the tests package.
    ray.cloudpickle.register_pickle_by_value(scripted_agent)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def server_settings(mock_upstream: str) -> dict:
    return {"deployment": "demo", "env": {"MOCK_UPSTREAM_URL": mock_upstream + "/v1"}}


def servers_under(path) -> list[psutil.Process]:
    """`serve` processes whose capture directory is under `path` (LocalServer puts it on the command line)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if "server.cli serve" in cmdline and str(path) in cmdline:
            found.append(process)
    return found


def alive_node_ids() -> set[str]:
    return {node["NodeID"] for node in ray.nodes() if node["Alive"]}


def test_four_rollouts_spread_over_both_nodes_come_back_whole(cluster, mock_upstream, tmp_path):
    captures = tmp_path / "captures"
    refs = [
        submit_rollout(
            scripted_agent.run, f"ray-{i}", server=server_settings(mock_upstream), capture_root=str(captures)
        )
        for i in range(4)
    ]
    results = get_rollouts(refs, timeout=280)
    assert [r["errors"] for r in results] == [[]] * 4
    assert {r["node_id"] for r in results} == alive_node_ids()  # both nodes ran rollouts

    for i, result in enumerate(results):
        assert result["result"]["rollout_id"] == f"ray-{i}"
        [rollout] = result["rollouts"]
        assert rollout["session_id"] == f"ray-{i}" and rollout["mask_sample"] is False
        assert [sub["session_id"] for sub in rollout["subagents"]] == [f"ray-{i}-sub"]
        # Whole: exactly what a reader rebuilds from that attempt's records, token triples included.
        [attempt] = [d for d in captures.iterdir() if CaptureStore.open_read_only(d).session_info(f"ray-{i}")]
        assert rollout == build_rollout(CaptureStore.open_read_only(attempt), f"ray-{i}")
        assert len(rollout["record_uuids"]) + len(rollout["subagents"][0]["record_uuids"]) == 4
    assert len(list(captures.iterdir())) == 4  # a directory per attempt
    assert servers_under(captures) == []


def test_removing_a_node_ends_its_rollout_with_an_error_and_the_others_complete(cluster, mock_upstream, tmp_path):
    doomed_node = cluster.add_node(num_cpus=1, node_ip_address=LOOPBACK)
    cluster.wait_for_nodes()
    head_id = ray.get_runtime_context().get_node_id()  # the driver runs on the head node
    doomed_id = doomed_node.node_id
    assert doomed_id in alive_node_ids() and doomed_id != head_id
    hold = {name: str(tmp_path / f"release-{name}") for name in ("doomed", "survivor")}
    refs = {
        name: submit_rollout(
            scripted_agent.run,
            name,
            hold[name],
            server=server_settings(mock_upstream),
            capture_root=str(tmp_path / name),
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        )
        for name, node_id in (("doomed", doomed_id), ("survivor", head_id))
    }
    started = wait_for(lambda: all(os.path.exists(path + ".started") for path in hold.values()), 240, interval=0.2)
    assert started, "the rollouts did not get going"
    doomed_servers = servers_under(tmp_path / "doomed")
    assert len(doomed_servers) == 1  # the rollout is mid-run, its server up

    cluster.remove_node(doomed_node, allow_graceful=False)
    # Only the survivor is let go: the doomed rollout stays held, so it can end only through its
    # node's death (a worker process outlives its raylet for a moment, and could otherwise finish).
    open(hold["survivor"], "w").close()
    doomed, survivor = get_rollouts([refs["doomed"], refs["survivor"]], timeout=240)

    assert doomed["result"] is None and doomed["rollouts"] == [] and doomed["errors"]
    assert survivor["errors"] == [] and survivor["node_id"] == head_id
    [rollout] = survivor["rollouts"]
    assert rollout["mask_sample"] is False and [s["session_id"] for s in rollout["subagents"]] == ["survivor-sub"]
    # The dead node's server went with it (PR_SET_PDEATHSIG), and the survivor's was stopped.
    _, alive = psutil.wait_procs(doomed_servers, timeout=60)
    assert alive == []
    assert servers_under(tmp_path) == []
