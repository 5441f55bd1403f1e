"""`switchyard-model demo`: the whole stack on loopback and a scripted agent run through the openai SDK."""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import httpx

from server.cli.exits import EXIT_USAGE
from server.process import die_with_parent

# Quiet Switchyard's per-request log lines, but keep the INFO spans it exports when OTLP is set
# (RUST_LOG=warn alone would switch its span export off).
_QUIET_SWITCHYARD = "warn,switchyard_server=info,switchyard_server::request=warn,libsy=info"

ROOT_SESSION = "demo-root"
CHILD_SESSION = "demo-child"

WEATHER_TOOL: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
SHELL_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _wait_ready(proc: subprocess.Popen[bytes], url: str, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode} while starting")
        try:
            if httpx.get(url, timeout=1.0, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not become ready at {url}")


# The signals that end the demo, however it was started. SIGINT is among them even when the shell
# started the demo in the background with SIGINT ignored: `kill -INT` must still stop the stack.
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _start(argv: list[str], env: dict[str, str], **kw: Any) -> subprocess.Popen[bytes]:
    """A child of the demo that ends with it: SIGTERM when the demo dies, even by SIGKILL, and a
    process group of its own, so the demo can sweep up whatever the child itself started."""
    return subprocess.Popen[bytes](
        argv,
        env=env,
        start_new_session=True,  # a terminal's Ctrl-C or hangup reaches the demo, which stops the stack in order
        preexec_fn=functools.partial(die_with_parent, os.getpid()),
        **kw,
    )


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _hurry(procs: list[subprocess.Popen[bytes]]) -> Callable[[int, FrameType | None], None]:
    """While the stack is being stopped, a second signal kills what is left instead of waiting."""

    def kill_all(signum: int, frame: FrameType | None) -> None:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)

    return kill_all


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (SIGKILL after 15 s), then SIGKILL to whatever is left in the child's process group."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _say(text: str = "") -> None:
    print(text, flush=True)


def _fake_weather(city: str) -> str:
    return json.dumps({"city": city, "forecast": "sunny", "celsius": 21})


def run_agent(base_url: str) -> None:
    """A root agent with a tool call (Responses API), then a sub-agent it delegates to (Chat API)."""
    import openai  # the `demo` extra: serving does not need it, run_demo checks it is there

    http = openai.DefaultHttpxClient(trust_env=False, timeout=60)  # loopback: no proxy variables
    root = openai.OpenAI(
        base_url=base_url + "/v1", api_key="demo", http_client=http, default_headers={"x-session-id": ROOT_SESSION}
    )
    _say(f"1. root agent (session {ROOT_SESSION}), Responses API, asks for the weather with a tool:")
    history: list[Any] = [{"role": "user", "content": 'Weather in Paris? [[mock:tool get_weather {"city": "Paris"}]]'}]
    first = root.responses.create(model="demo", input=history, tools=[WEATHER_TOOL])
    call = next(item for item in first.output if item.type == "function_call")
    _say(f"   model ({first.model}) called {call.name}({call.arguments})")
    result = _fake_weather(json.loads(call.arguments)["city"])
    history += [item.model_dump(exclude_none=True) for item in first.output]
    history.append({"type": "function_call_output", "call_id": call.call_id, "output": result})
    second = root.responses.create(model="demo", input=history, tools=[WEATHER_TOOL])
    _say(f"   tool answered {result}; model replied: {second.output_text!r}")

    child = openai.OpenAI(
        base_url=base_url + "/v1",
        api_key="demo",
        http_client=http,
        default_headers={"x-session-id": CHILD_SESSION, "x-parent-session-id": ROOT_SESSION},
    )
    _say(f"2. sub-agent (session {CHILD_SESSION}, parent {ROOT_SESSION}), streaming Chat API with a shell tool:")
    messages: list[Any] = [{"role": "user", "content": 'List the files. [[mock:tool bash {"command": "ls"}]]'}]
    stream = child.chat.completions.create(model="demo", messages=messages, tools=[SHELL_TOOL], stream=True)
    tool_call: dict[str, Any] = {"id": None, "name": "", "arguments": ""}
    for chunk in stream:
        for delta_call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            tool_call["id"] = delta_call.id or tool_call["id"]
            if delta_call.function is not None:
                tool_call["name"] += delta_call.function.name or ""
                tool_call["arguments"] += delta_call.function.arguments or ""
    _say(f"   streamed tool call {tool_call['name']}({tool_call['arguments']})")
    messages.append(
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": tool_call["id"],
                    "type": "function",
                    "function": {"name": tool_call["name"], "arguments": tool_call["arguments"]},
                }
            ],
        }
    )
    messages.append({"role": "tool", "tool_call_id": tool_call["id"], "content": "README.md\nserver\n"})
    final = child.chat.completions.create(model="demo", messages=messages, tools=[SHELL_TOOL])
    _say(f"   model replied: {final.choices[0].message.content!r}")


def show_capture(base_url: str) -> None:
    def get(path: str) -> dict[str, Any]:
        body: dict[str, Any] = httpx.get(base_url + path, trust_env=False, timeout=30).json()
        return body

    _say("3. what was captured (GET /v1/sessions, /tree, /rollout):")
    for session in get("/v1/sessions")["sessions"]:
        _say(
            f"   session {session['session_id']:<12} parent {str(session['parent_session_id']):<10} "
            f"records {session['record_count']}"
        )
    tree = get(f"/v1/sessions/{ROOT_SESSION}/tree")
    _say(f"   tree: {ROOT_SESSION} -> {[c['session_id'] for c in tree.get('children', [])]}")
    rollout = get(f"/v1/sessions/{ROOT_SESSION}/rollout")
    for r in [rollout, *rollout.get("subagents", [])]:
        generated = sum(len(item.get("generation_token_ids") or []) for item in r["output"])
        _say(
            f"   rollout {r['session_id']}: {len(r['record_uuids'])} calls, {len(r['input'])} input items, "
            f"{len(r['output'])} output items, {generated} generated tokens, partial={r['partial_reason']!r}, "
            f"mask_sample={r['mask_sample']}"
        )


def _curl_examples(base_url: str, mock_port: int) -> str:
    return f"""
The stack is up. Try:
  curl -s {base_url}/v1/responses -H 'content-type: application/json' -H 'x-session-id: my-session' \\
       -d '{{"model": "demo", "input": "Hello!"}}'
  curl -sN {base_url}/v1/chat/completions -H 'content-type: application/json' \\
       -d '{{"model": "demo", "stream": true, "messages": [{{"role": "user", "content": "Hi"}}]}}'
  curl -s {base_url}/v1/sessions
  curl -s {base_url}/v1/sessions/my-session/rollout
A server of your own, with its own options, in front of the same mock upstream:
  MOCK_UPSTREAM_URL=http://127.0.0.1:{mock_port}/v1 switchyard-model serve --deployment demo \\
       --port 8081 --token-injection
Press Ctrl-C to stop."""


def run_demo(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("openai") is None:
        print(
            "switchyard-model demo: the demo drives the stack with the openai SDK; "
            "install it with: pip install 'switchyard-model[demo]'",
            file=sys.stderr,
        )
        return EXIT_USAGE
    procs: list[subprocess.Popen[bytes]] = []
    previous = {sig: signal.signal(sig, _interrupt) for sig in _STOP_SIGNALS}
    try:
        return _run_chain(args, procs)
    finally:
        for sig in _STOP_SIGNALS:
            signal.signal(sig, _hurry(procs))
        for proc in reversed(procs):
            _stop(proc)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run_chain(args: argparse.Namespace, procs: list[subprocess.Popen[bytes]]) -> int:
    """Start the stack (each process added to `procs` as it starts), run the agent, and serve if asked."""
    env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "PYTHONUNBUFFERED": "1"}
    mock_port = _free_port()
    port = args.port or _free_port()
    capture_dir = args.capture_dir or tempfile.mkdtemp(prefix="switchyard-demo-")
    try:
        # The mock's own "listening on" line goes nowhere: the demo says where everything is, once.
        mock = _start(
            [sys.executable, "-m", "server.dev.mock_upstream", "--port", str(mock_port)],
            env,
            stdout=subprocess.DEVNULL,
        )
        procs.append(mock)
        _wait_ready(mock, f"http://127.0.0.1:{mock_port}/health", "the mock upstream")
        env["MOCK_UPSTREAM_URL"] = f"http://127.0.0.1:{mock_port}/v1"
        server = _start(
            [
                sys.executable,
                "-m",
                "server.cli",
                "serve",
                "--deployment",
                "demo",
                "--port",
                str(port),
                "--capture-dir",
                capture_dir,
                "--log-level",
                "warning",
            ],
            {**env, "RUST_LOG": os.environ.get("RUST_LOG", _QUIET_SWITCHYARD)},
        )
        procs.append(server)
        base_url = f"http://127.0.0.1:{port}"
        _wait_ready(server, base_url + "/health", "switchyard-model")
        _say(f"mock upstream  http://127.0.0.1:{mock_port}  (deterministic vLLM-compatible model 'mock-model')")
        _say(f"switchyard-model {base_url}  hosting Switchyard from {Path('profiles/demo.toml')} (route 'demo')")
        _say(f"captures       {capture_dir}")
        _say()
        run_agent(base_url)
        show_capture(base_url)
        if args.serve:
            _say(_curl_examples(base_url, mock_port))
            try:
                server.wait()
            except KeyboardInterrupt:
                pass
        return 0
    except Exception as exc:  # a demo failure should say what broke, in one line
        print(f"demo failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
