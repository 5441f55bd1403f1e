"""How token ids travel on the chat path for each engine, and how its echo proves it used them.

- `vllm`: `kv_transfer_params.prompt_token_ids` (the field path is configurable: vLLM may add a
  first-class field); the engine skips its template and uses the ids as the whole prompt.
- `sglang`: `input_ids`, the same semantics.
- `nemo_rl`: `required_prefix_token_ids` with the accumulated history only; the engine renders the
  template and splices its own tail after the history's last end-of-turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, get_args

import orjson

from server.config import Engine
from server.injection.id_lists import begins_with, id_list_json

# The engines ids can be sent to, as the `injection_transport` setting's type lists them (the one list;
# tests/test_lists.py checks id_field_for, the docs and the tests' toy engine against it).
ENGINES: tuple[Engine, ...] = get_args(Engine)
DEFAULT_VLLM_FIELD = "kv_transfer_params.prompt_token_ids"


@dataclass(frozen=True, slots=True)
class IdField:
    name: str
    field_path: tuple[str, ...]  # where the ids go in the chat body
    sends_history_only: bool  # nemo_rl: the engine appends the suffix itself

    def attach(self, body: dict[str, Any], history: list[int], suffix: list[int]) -> list[int]:
        """Put the ids into `body` (in place; a caller's sibling keys are kept) and return what was sent."""
        ids = list(history) if self.sends_history_only else history + suffix
        target = body
        for key in self.field_path[:-1]:
            nested = target.get(key)
            # Merged, never replaced: the caller's own kv_transfer_params stay as they were sent.
            nested = dict(nested) if isinstance(nested, dict) else {}
            target[key] = nested
            target = nested
        target[self.field_path[-1]] = ids
        return ids

    def splice(self, payload: bytes, ids_json: bytes) -> bytes:
        """`payload` (a request's JSON object, without this transport's top-level key) with the ids
        (`ids_json`, their JSON) added: the same JSON value as serialising the attached body, without
        serialising the messages again."""
        value = ids_json
        for key in reversed(self.field_path[1:]):
            value = b"{" + orjson.dumps(key) + b":" + value + b"}"
        member = orjson.dumps(self.field_path[0]) + b":" + value
        head = payload.rstrip()[:-1].rstrip()  # without its closing brace
        return head + (b"," if head != b"{" else b"") + member + b"}"

    def echo_ok(self, sent_json: bytes, echoed: Any) -> bool:
        """The engine's `prompt_token_ids` prove it used the ids sent (`sent_json`, their compact JSON):
        the same ids, or for nemo_rl's splice the sent ids followed by more. Compared as JSON (id_lists.py)."""
        encoded = id_list_json(echoed)
        if encoded is None:
            return False
        if self.sends_history_only:
            return encoded != sent_json and begins_with(encoded, sent_json)
        return encoded == sent_json


def id_field_for(name: str, vllm_field: str = DEFAULT_VLLM_FIELD) -> IdField:
    if name == "vllm":
        path = tuple(part for part in vllm_field.split(".") if part)
        if not path:
            raise ValueError("injection_vllm_field must name a field, e.g. kv_transfer_params.prompt_token_ids")
        return IdField("vllm", path, False)
    if name == "sglang":
        return IdField("sglang", ("input_ids",), False)
    if name == "nemo_rl":
        return IdField("nemo_rl", ("required_prefix_token_ids",), True)
    raise ValueError(f"unknown injection_transport {name!r}; expected one of {', '.join(ENGINES)}")
