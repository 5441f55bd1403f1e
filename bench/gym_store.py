"""What NeMo Gym's own token store costs per training call on this host: CPU (user + kernel) and wall time.

Each call does what the server does on Gym's training path, through Gym's own code (server.capture.gym.tokens):
`GymTokenCapture.begin` (lineage, and the store's intent: lock file, state read, intent line fsynced) then
`GymTokenCapture.commit` (Gym's entry built from a Responses answer of the bench's size, then the store's
append: lock, state read, entry line fsynced, state file rewritten through a new temporary file); and the
store's two steps alone (`begin_call`, `put`) with the entries built beforehand. Measured
in one process with nothing else running, sequentially and with 64 calls in flight over 64 rollouts (as
bench/twins.py sends them), in a folder on the bench's disk and on /dev/shm (no disk: what is left is CPU).

    .venv/bin/python bench/gym_store.py [--calls 2000] [--dir PATH ...]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from server.capture.gym.tokens import GymTokenCapture, request_items

PROMPT, GENERATED = 24, 16  # about the bench's SMALL Responses call (bench/calls.py)
ROLLOUTS = 64


def served(k: int) -> dict[str, Any]:
    """A Responses answer with its token triple on its one output item, as the server hands it to Gym."""
    return {
        "id": f"resp_{k}",
        "object": "response",
        "model": "demo",
        "output": [
            {
                "type": "message",
                "id": f"msg_{k}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "word " * GENERATED, "annotations": []}],
                "prompt_token_ids": list(range(PROMPT)),
                "generation_token_ids": list(range(1000, 1000 + GENERATED)),
                "generation_log_probs": [-0.5] * GENERATED,
            }
        ],
    }


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this process, user and kernel
    return usage.ru_utime + usage.ru_stime


async def one(gym: GymTokenCapture, k: int, items: list[dict[str, Any]]) -> None:
    token = await gym.begin(f"bench-{k % ROLLOUTS}", uuid.uuid4().hex, items)
    try:
        await GymTokenCapture.commit(served(k), items)
    finally:
        GymTokenCapture.end(token)


async def store_only(gym: GymTokenCapture, entry: Any) -> None:
    """The store's two steps alone, the entry built beforehand: intent, then entry."""
    await gym.sink.begin_call(entry.rollout_id, entry.model_call_id)
    await gym.sink.put(entry)


def entries(calls: int) -> list[Any]:
    from nemo_gym.token_id_capture.records import TokenEntry

    item = served(0)["output"][0]
    return [
        TokenEntry(
            rollout_id=f"bench-{k % ROLLOUTS}",
            model_call_id=uuid.uuid4().hex,
            model="demo",
            prompt_token_ids=item["prompt_token_ids"],
            generation_token_ids=item["generation_token_ids"],
            generation_log_probs=item["generation_log_probs"],
            output_items=[{k: v for k, v in item.items() if not k.endswith(("_ids", "_probs"))}],
            token_item_index=0,
        )
        for k in range(calls)
    ]


async def measure(root: Path, calls: int, concurrency: int, store: bool) -> tuple[float, float]:
    """(CPU seconds, wall seconds) per call: through Gym's capture functions, or (`store`) the store alone."""
    gym = GymTokenCapture.from_gym_settings({"token_id_capture": {"enabled": True, "dir": str(root)}})
    assert gym is not None
    items = request_items({"input": "Summarize the plan in one line. [[mock:tokens 16]]"})
    for k in range(ROLLOUTS):  # every rollout's files exist already, as in a running bench
        await one(gym, k, items)
    built = entries(calls) if store else []
    sem = asyncio.Semaphore(concurrency)

    async def limited(k: int) -> None:
        async with sem:
            await (store_only(gym, built[k]) if store else one(gym, k, items))

    c0, t0 = cpu(), time.perf_counter()
    await asyncio.gather(*(limited(k) for k in range(calls)))
    c1, t1 = cpu(), time.perf_counter()
    await gym.close()
    return (c1 - c0) / calls, (t1 - t0) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--dir", action="append", help="parent folders to test (default: the temp dir and /dev/shm)")
    args = parser.parse_args()
    parents = args.dir or [tempfile.gettempdir(), "/dev/shm"]
    print(f"{'folder':<12} {'what':<22} {'in flight':>9} {'CPU us/call':>12} {'wall us/call':>13}")
    for parent in parents:
        if not Path(parent).is_dir():
            continue
        for store, what in ((False, "Gym's capture calls"), (True, "Gym's store alone")):
            for concurrency in (1, 64):
                root = Path(tempfile.mkdtemp(prefix="gym-store-", dir=parent))
                try:
                    cpu_s, wall_s = asyncio.run(measure(root, args.calls, concurrency, store))
                finally:
                    shutil.rmtree(root, ignore_errors=True)
                print(f"{parent:<12} {what:<22} {concurrency:>9} {cpu_s * 1e6:>12.0f} {wall_s * 1e6:>13.0f}")


if __name__ == "__main__":
    main()
