"""Rollouts as Ray tasks, each with its own server: `submit_rollout(agent_fn, *args, server={...})` (extra `[ray]`).

The task runs on whichever node Ray picks (SPREAD by default), starts a `LocalServer` there with a
capture directory of its own for this attempt, calls `agent_fn(base_url, *args)`, stops the server,
rebuilds the rollouts from the now complete records, and returns them through the object store:

    {"result": <agent_fn's return value>, "rollouts": [...], "chains": [...], "errors": [...], "node_id": "..."}

Nothing is shared between rollouts, so a dead node takes only its own rollouts with it. `server` is
plain data (Settings fields plus `env` and the timeouts LocalServer takes), checked on the node.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

try:
    import ray
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("server.ray_tasks needs Ray: pip install 'switchyard-model[ray]'") from exc

DEFAULT_OPTIONS: dict[str, Any] = {
    "scheduling_strategy": "SPREAD",
    "num_cpus": 0.1,
    # A retry would rerun the agent against a fresh server; whether that is right is the caller's call.
    "max_retries": 0,
}
DEFAULT_CAPTURE_ROOT = "switchyard-rollouts"  # under the node's temporary directory


def submit_rollout(
    agent_fn: Callable[..., Any],
    *args: Any,
    server: dict[str, Any] | None = None,
    capture_root: str | None = None,
    copy_to: str | None = None,
    **ray_options: Any,
) -> ray.ObjectRef[dict[str, Any]]:
    """Run `agent_fn(base_url, *args)` in a Ray task beside a server of its own; returns the task's ObjectRef.

    `ray_options` override the defaults (`scheduling_strategy="SPREAD"`, `num_cpus=0.1`,
    `max_retries=0`, `runtime_env={"py_executable": sys.executable}`). Each attempt captures into
    a fresh directory under `capture_root` (default: `switchyard-rollouts` in the node's temporary
    directory), so a retry never mixes two attempts' records; `copy_to` also copies it to that
    (shared) directory.
    """
    options = {**DEFAULT_OPTIONS, "runtime_env": {"py_executable": sys.executable}, **ray_options}
    task = ray.remote(run_rollout).options(**options)
    return task.remote(agent_fn, list(args), dict(server or {}), capture_root, copy_to)


def run_rollout(
    agent_fn: Callable[..., Any],
    args: Sequence[Any],
    server: dict[str, Any],
    capture_root: str | None,
    copy_to: str | None,
) -> dict[str, Any]:
    """The task body (also callable without Ray): a LocalServer around one agent run. Never raises."""
    from server.spawn import LocalServer

    node_id = _node_id()
    attempt = f"{time.strftime('%Y%m%dT%H%M%S')}-{_task_id() or 'local'}-{uuid.uuid4().hex[:8]}"
    capture_dir = Path(capture_root or os.path.join(tempfile.gettempdir(), DEFAULT_CAPTURE_ROOT)) / attempt
    outcome: dict[str, Any] = {"result": None, "rollouts": [], "chains": [], "errors": [], "node_id": node_id}
    agent_error = None
    try:
        local = LocalServer(capture_dir=capture_dir, **server)
    except Exception as exc:  # settings that do not validate here, on the node
        outcome["errors"].append(f"server settings: {type(exc).__name__}: {exc}")
        return outcome
    try:
        with local:
            try:
                outcome["result"] = agent_fn(local.base_url, *args)
            except Exception as exc:
                agent_error = f"agent raised {type(exc).__name__}: {exc}"
                outcome["errors"].append(f"{agent_error}\n{traceback.format_exc(limit=8)}")
    except Exception as exc:  # the server did not start: the agent never ran
        outcome["errors"].append(f"{type(exc).__name__}: {exc}")
    collected = local.collect()
    outcome["rollouts"] = collected["rollouts"]
    outcome["chains"] = collected["chains"]
    outcome["errors"] += [e for e in collected["errors"] if e not in outcome["errors"]]
    if agent_error is not None:
        # The episode did not finish: its tokens are real, but a trainer must not score it.
        for rollout in outcome["rollouts"]:
            rollout["mask_sample"] = True
            rollout["degraded_reason"] = rollout.get("degraded_reason") or agent_error
        for body in outcome["chains"]:
            body["mask_sample"], body["degraded_reason"] = True, agent_error
    if copy_to:
        try:
            shutil.copytree(capture_dir, Path(copy_to) / attempt, dirs_exist_ok=True)
        except OSError as exc:
            outcome["errors"].append(f"copying {capture_dir} to {copy_to}: {exc}")
    return outcome


def get_rollouts(refs: Sequence[ray.ObjectRef[dict[str, Any]]], timeout: float | None = None) -> list[dict[str, Any]]:
    """`ray.get` each rollout task, turning a task that failed (a node died, a timeout) into an error result."""
    deadline = None if timeout is None else time.monotonic() + timeout
    results = []
    for ref in refs:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            results.append(ray.get(ref, timeout=remaining))
        except (ray.exceptions.RayError, TimeoutError) as exc:
            results.append(
                {
                    "result": None,
                    "rollouts": [],
                    "chains": [],
                    "errors": [f"{type(exc).__name__}: {exc}"],
                    "node_id": None,
                }
            )
    return results


def _node_id() -> str | None:
    # Outside Ray, get_runtime_context() would start or join a cluster (Ray's auto-init), and a stale
    # /tmp/ray address from an earlier cluster makes that hang: ask only when Ray is already up.
    if not ray.is_initialized():
        return None
    try:
        return ray.get_runtime_context().get_node_id()
    except Exception:
        return None


def _task_id() -> str | None:
    if not ray.is_initialized():
        return None
    try:
        return ray.get_runtime_context().get_task_id()
    except Exception:
        return None
