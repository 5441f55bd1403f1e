"""The injector's own CPU per injected call at growing context lengths, in process (no HTTP, no engine).

Usage: python bench/injector_cpu.py [--words 50,1000,4400] [--rounds R] [--tree NAME=PATH ...]

8-turn toy sessions (tests/support/toy_engine.py: a template that drops past reasoning) with tool
results of WORDS tokens each, so the last prompt holds about 2,000 + 7 x WORDS ids. Ids start at
100,000, as a real vocabulary's do, so equal lists hold distinct int objects (CPython shares only
ints up to 256, which would make list comparisons look free). Each `/tokenize` answer reaches the
injector as bytes and is parsed and checked as `TokenizeClient` does; each engine answer is parsed
from its JSON as the server does. Timed: `prepare` (less the toy template's own render) and
`finish`, calls 2..8, median per round; `--tree NAME=PATH` runs the same in another checkout (a
child process per tree and round, rounds interleaved), for A/B.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


async def _child(words: int) -> float:
    """Run in a tree's checkout (cwd on sys.path): the median injector CPU per call, in µs."""
    import orjson

    from server.injection import tokenize as tk
    from server.injection.injector import Injector
    from server.injection.transports import make_transport
    from tests.support import toy_engine

    toy_engine.Vocab.words = lambda self, text: [  # type: ignore[method-assign]
        self.ids.setdefault(w, 100_000 + len(self.ids)) for w in text.split()
    ]
    fields = {f.name for f in dataclasses.fields(tk.Render)}
    generation_prompt = [toy_engine.START, toy_engine.ROLES["assistant"]]
    engine = toy_engine.engine_for("vllm")

    def render_of(raw: bytes):  # type: ignore[no-untyped-def]
        """The Render the tree's TokenizeClient makes of a /tokenize answer (three generations of it)."""
        if hasattr(tk, "_tokens_cut_out"):  # the ids stay bytes
            encoded, n, length = tk._tokens_cut_out(raw)
            return tk.Render(encoded, n, length, generation_prompt=tuple(generation_prompt))
        tokens = orjson.loads(raw)["tokens"]
        if "prefix_json" in fields:  # parsed, and checked as JSON
            from server.injection.ids import id_list_json

            return tk.Render(tokens, tokens + generation_prompt, 10**6, id_list_json(tokens))  # type: ignore[call-arg]
        assert tk.is_id_list(tokens)  # type: ignore[attr-defined]  # parsed, lists compared
        return tk.Render(tokens, tokens + generation_prompt, 10**6)  # type: ignore[call-arg]

    class WireTokenizer:
        toy_s = 0.0  # the toy template's render, not the injector's work: subtracted

        async def render(self, messages, tools, template):  # type: ignore[no-untyped-def]
            t0 = time.thread_time()
            tokens = engine.render(messages, False)
            raw = orjson.dumps({"count": len(tokens), "max_model_len": 10**6, "tokens": tokens, "token_strs": None})
            self.toy_s += time.thread_time() - t0
            return render_of(raw)

    tokenizer = WireTokenizer()
    injector = Injector(transport=make_transport("vllm"), tokenizer_for=lambda route: tokenizer, read_records=None)
    spent = []
    for s in range(6):
        messages = [{"role": "system", "content": "rules " * 1000}, {"role": "user", "content": f"task {s}"}]
        for turn in range(8):
            tokenizer.toy_s = 0.0
            t0 = time.thread_time()
            plan = await injector.prepare(f"s{s}", "r", {"model": "m", "messages": list(messages)})
            await asyncio.sleep(0)  # the prefix digest runs while the call would be upstream
            t1 = time.thread_time()
            reply = orjson.loads(orjson.dumps(engine.chat(plan.body, {"reasoning": "think " * 30, "tools": ["bash"]})))
            t2 = time.thread_time()
            record = injector.finish(plan, reply)
            t3 = time.thread_time()
            if turn:
                assert record["fallback_reason"] is None, record
                spent.append((t1 - t0) + (t3 - t2) - tokenizer.toy_s)
            tool = {"role": "tool", "tool_call_id": "c0", "content": "ok " * words}
            messages += [reply["choices"][0]["message"], tool]
    return statistics.median(spent) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/injector_cpu.py", description=__doc__.splitlines()[0])
    parser.add_argument("--words", default="50,1000,4400")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tree", action="append", default=[], help="NAME=PATH: another checkout, side by side")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        sys.path.insert(0, os.getcwd())
        gc.disable()  # the server tunes its collector (server/process.py); here it would only add noise
        print(json.dumps(asyncio.run(_child(args.child))))
        return 0
    trees = {"this": HERE, **{name: Path(path) for name, _, path in (t.partition("=") for t in args.tree)}}
    for words in (int(w) for w in args.words.split(",")):
        results: dict[str, list[float]] = {name: [] for name in trees}
        for r in range(args.rounds):
            for name in list(trees) if r % 2 == 0 else list(reversed(trees)):
                out = subprocess.run(
                    [sys.executable, str(Path(__file__).resolve()), "--child", str(words)],
                    cwd=trees[name],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                results[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
        shown = ", ".join(
            f"{name} {statistics.median(v):.0f} µs (rounds {min(v):.0f}-{max(v):.0f})" for name, v in results.items()
        )
        print(f"tool results {words:5d} tokens (last prompt ~{2000 + 7 * words} ids): injector CPU per call {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
