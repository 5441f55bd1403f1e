"""The `renderers` bridge's work per call (extra `[tito]`, real Qwen3 renderer): bridged against rendered whole.

Usage: python bench/bridge.py [--rounds R] [--sessions S] [--turns T]

The injector decides each call of S agent sessions (T turns, a tool call and a tool result per turn,
the system prompt and tools of bench/injection.py, so ~1,200 prompt ids by the last turn) with the
local Qwen3 renderer in two ways, rounds interleaved: with its bridge (the new messages rendered
onto the chain's prompt + generation), and without it (every call rendered whole, twice, and cut
after the chain's last request, which is what the bridge did before and what /tokenize does on the
engine). The engine is played by the injector itself: a call's prompt is the ids it injected (or its
render), its generation a Qwen3 reasoning + tool-call turn. It prints, for calls 2..T, the time
from `prepare` to the end of `finish` (p50) and the process CPU per call (threads included: a whole
render runs in one), and their ratios.
Both ways must inject the same ids, which it checks.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.injection import SYSTEM, TOOLS  # noqa: E402
from server.injection.id_fields import id_field_for  # noqa: E402
from server.injection.injector import Injector  # noqa: E402
from server.injection.renderers_bridge import RendererTokenizer, renderer_factory  # noqa: E402


class WholeRenders:
    """The local renderer without its bridge."""

    def __init__(self, inner: RendererTokenizer) -> None:
        self.render = inner.render


async def _session(injector: Injector, tok: Any, name: str, turns: int) -> tuple[list[float], float, list[list[int]]]:
    """Seconds per call and process CPU seconds of calls 2.., and the ids each call injected."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"({name}) fix it"},
    ]
    seconds, cpu, sent = [], 0.0, []
    for turn in range(turns):
        arguments = f'{{"command": "step {turn}"}}'
        text = (
            f"<think>\nStep {turn} next.\n</think>\n\n"
            f'<tool_call>\n{{"name": "bash", "arguments": {arguments}}}\n</tool_call>'
        )
        generation = tok.encode(text) + [tok.convert_tokens_to_ids("<|im_end|>")]
        t0, cpu0 = time.perf_counter(), time.process_time()
        plan = await injector.prepare(name, "r", {"messages": messages, "tools": TOOLS})
        prompt = plan.sent if plan.injected else plan.render.prompt
        chat = {"prompt_token_ids": prompt, "choices": [{"token_ids": generation, "finish_reason": "tool_calls"}]}
        injector.finish(plan, chat)
        if turn:
            seconds.append(time.perf_counter() - t0)
            cpu += time.process_time() - cpu0
            if not plan.injected:
                raise SystemExit(f"call {turn + 1} of {name} was not injected: {plan.reason}")
            sent.append(plan.sent)
        call = {"id": f"c{turn}", "type": "function", "function": {"name": "bash", "arguments": arguments}}
        messages = messages + [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{turn}", "content": "ok " * 50},
        ]
    return seconds, cpu, sent


async def _measure(rounds: int, sessions: int, turns: int) -> None:
    make = renderer_factory("Qwen/Qwen3-8B")
    local = RendererTokenizer(make)
    tok = make({})._tokenizer
    ways = {"bridged": local, "rendered whole": WholeRenders(local)}
    latency: dict[str, list[float]] = {way: [] for way in ways}
    cpu: dict[str, float] = {way: 0.0 for way in ways}
    injected: dict[str, list[list[int]]] = {way: [] for way in ways}

    def injector(way: str) -> Injector:
        return Injector(id_field=id_field_for("vllm"), tokenizer_for=lambda route: ways[way], read_records=None)

    for way in ways:  # warm-up: the renderer per template options, first imports
        await _session(injector(way), tok, "warm", turns)
    for r in range(rounds):
        for way in ways if r % 2 == 0 else reversed(ways):
            deciding = injector(way)
            for s in range(sessions):
                seconds, seconds_cpu, sent = await _session(deciding, tok, f"s{r}-{s}", turns)
                latency[way] += seconds
                cpu[way] += seconds_cpu
                if r == 0:
                    injected[way] += sent
    if injected["bridged"] != injected["rendered whole"]:
        raise SystemExit("the bridge and the whole render injected different ids")
    calls = rounds * sessions * (turns - 1)
    p50 = {way: statistics.median(values) * 1e3 for way, values in latency.items()}
    per_call = {way: cpu[way] / calls * 1e3 for way in ways}
    print(
        f"{calls} injected calls per way ({rounds} rounds x {sessions} sessions x calls 2..{turns}); same ids both ways"
    )
    print(f"{'way':16s} {'p50 ms':>8s} {'CPU ms/call':>12s}")
    for way in ways:
        print(f"{way:16s} {p50[way]:8.3f} {per_call[way]:12.3f}")
    whole, bridged = p50["rendered whole"], p50["bridged"]
    print(f"bridged / whole: p50 {bridged / whole:.2f}, CPU {per_call['bridged'] / per_call['rendered whole']:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--sessions", type=int, default=10)
    parser.add_argument("--turns", type=int, default=8)
    args = parser.parse_args()
    asyncio.run(_measure(args.rounds, args.sessions, args.turns))


if __name__ == "__main__":
    main()
