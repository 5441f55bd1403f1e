"""Sessions shaped like real frameworks' wire traffic, one per break kind that names what the client did.

Each fixture is the list of chat calls a framework made in one session (the request's messages, then
the answer it got), turned into capture records by the scripted sessions' toy template. Two are
recorded live from pydantic-ai (in the venv) through an in-process transport that stands in for the
server; the shapes of frameworks not installed here (DSPy, strands) are rebuilt from their request
formats, each with its source said in its docstring. The text is ours; the shapes are theirs.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import httpx

from server.translate.request import responses_to_chat
from tests.support.scripted_sessions import MODEL, _body, render

Call = tuple[list[dict[str, Any]], dict[str, Any]]  # (request messages, the answer)


def records_of(session_id: str, calls: list[Call], tools: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Capture records of these calls, in order, with token ids from the toy template."""
    out = []
    for n, (messages, reply) in enumerate(calls):
        generation = _body(reply)
        out.append(
            {
                "schema_version": 1,
                "uuid": f"{session_id}-{n:03d}",
                "session_id": session_id,
                "parent_session_id": None,
                "captured_at": f"2026-07-14T01:00:{n:02d}.000000+00:00",
                "request_id": f"req-{n}",
                "model": MODEL,
                "messages": copy.deepcopy(messages) + [reply],
                "tools": tools or [],
                "tool_choice": "auto",
                "prompt_token_ids": render(messages),
                "generation_token_ids": generation,
                "generation_log_probs": [-0.5] * len(generation),
                "finish_reason": "tool_calls" if reply.get("tool_calls") else "stop",
                "is_valid": True,
            }
        )
    return out


# ---- recorded live: pydantic-ai over an in-process transport ---------------------------------------


def _pydantic_ai_calls(
    run: Callable[[Any, Callable[[], Any]], None], replies: Callable[[int], dict[str, Any]]
) -> list[Call]:
    """The chat calls a pydantic-ai agent sends (as they leave its OpenAI client), and the answers given."""
    from openai import AsyncOpenAI
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    calls: list[Call] = []

    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        reply = replies(len(calls))
        calls.append((body["messages"], reply))
        choice = {"index": 0, "message": reply, "finish_reason": "tool_calls" if reply.get("tool_calls") else "stop"}
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        return httpx.Response(
            200,
            json={
                "id": f"c{len(calls)}",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [choice],
                "usage": usage,
            },
        )

    def model() -> Any:
        client = AsyncOpenAI(
            base_url="http://in-process/v1",
            api_key="unused",
            http_client=httpx.AsyncClient(transport=httpx.MockTransport(answer)),
        )
        return OpenAIChatModel("m", provider=OpenAIProvider(openai_client=client))

    run(model(), model)
    return calls


def _compact(arguments: dict[str, Any]) -> str:
    """Arguments as a model writes them and clients send them back (no spaces), so only the kind of break
    under test breaks the tokens."""
    return json.dumps(arguments, separators=(",", ":"))


def _tool_call(n: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": _compact(arguments)}}
        ],
    }


def pydantic_ai_condensed() -> list[Call]:
    """`compacted`: a pydantic-ai agent whose history processor (its `ProcessHistory` capability)
    condenses the run: the first request (system prompt and task) kept, the tool turns between it and
    the latest exchange replaced by one short summary message. Recorded live."""
    from pydantic_ai import Agent
    from pydantic_ai.capabilities.process_history import ProcessHistory
    from pydantic_ai.messages import ModelRequest, UserPromptPart

    def condense(messages: list[Any]) -> list[Any]:  # pydantic-ai resolves these annotations at runtime
        if len(messages) <= 5:
            return messages
        summary = ModelRequest(parts=[UserPromptPart(content=f"So far: {len(messages[1:-2]) // 2} files read.")])
        return [messages[0], summary, *messages[-2:]]

    def run(model: Any, _: Callable[[], Any]) -> None:
        agent = Agent(model, system_prompt="You read files.", capabilities=[ProcessHistory(condense)])

        @agent.tool_plain
        def read_file(path: str) -> str:
            return f"the text of {path}, which is long enough to be worth condensing"

        agent.run_sync("Read the four parts and say what they hold.")

    return _pydantic_ai_calls(
        run,
        lambda n: (
            _tool_call(n + 1, "read_file", {"path": f"part{n + 1}.txt"})
            if n < 4
            else {"role": "assistant", "content": "They greet you."}
        ),
    )


def pydantic_ai_two_runs() -> list[Call]:
    """`new_conversation`: one agent run twice without `message_history` behind one session id (as a
    llama-index `FunctionAgent` run twice behind one header): the second run keeps only the system
    prompt. Recorded live."""
    from pydantic_ai import Agent

    def run(model: Any, _: Callable[[], Any]) -> None:
        agent = Agent(model, system_prompt="You do arithmetic.")

        @agent.tool_plain
        def multiply(a: int, b: int) -> int:
            return a * b

        agent.run_sync("What is 6 times 7?")
        agent.run_sync("And 3 times 5?")

    scripted = [
        _tool_call(1, "multiply", {"a": 6, "b": 7}),
        {"role": "assistant", "content": "42."},
        _tool_call(3, "multiply", {"a": 3, "b": 5}),
        {"role": "assistant", "content": "15."},
    ]
    return _pydantic_ai_calls(run, lambda n: scripted[n])


# ---- rebuilt from the request formats of frameworks not installed here -----------------------------

# DSPy's chat adapter: a system message that lists the signature's fields and the `[[ ## field ## ]]`
# layout, and one user message with the input fields, closing with what to answer with.
_DSPY_SYSTEM_CHAT = (
    "Your input fields are:\n1. `question` (str)\nYour output fields are:\n1. `answer` (str)\n"
    "Lay out every message as below.\n\n[[ ## question ## ]]\n{question}\n\n[[ ## answer ## ]]\n{answer}\n\n"
    "[[ ## completed ## ]]\nYour task: answer the question."
)
# Its JSON adapter, the one DSPy retries with when the chat adapter cannot parse an answer: the same
# fields, the outputs asked for as one JSON object.
_DSPY_SYSTEM_JSON = (
    "Your input fields are:\n1. `question` (str)\nYour output fields are:\n1. `answer` (str)\n"
    "Inputs come as below, outputs as one JSON object.\n\n[[ ## question ## ]]\n{question}\n\n"
    '{\n  "answer": "{answer}"\n}\nYour task: answer the question.'
)


def dspy_adapter_retry() -> list[Call]:
    """`retried_with_new_system_prompt`: a DSPy `Predict` whose answer the chat adapter could not parse
    (no field markers), asked again by the JSON adapter: a new system prompt, the same question, and
    closing words asking for JSON; the unparsed answer is not sent back."""
    question = "[[ ## question ## ]]\nWhich river runs through Vienna?\n\n"
    first = [
        {"role": "system", "content": _DSPY_SYSTEM_CHAT},
        {"role": "user", "content": question + "Answer with `[[ ## answer ## ]]`, then `[[ ## completed ## ]]`."},
    ]
    retry = [
        {"role": "system", "content": _DSPY_SYSTEM_JSON},
        {"role": "user", "content": question + "Answer with a JSON object holding `answer`."},
    ]
    return [
        (first, {"role": "assistant", "content": "The Danube, of course."}),
        (retry, {"role": "assistant", "content": '{"answer": "The Danube"}'}),
    ]


_REACT_SYSTEM = (
    "Your input fields are:\n1. `question` (str)\n2. `trajectory` (str)\nYour output fields are:\n"
    "1. `next_thought` (str)\n2. `next_tool_name` (Literal['search', 'finish'])\n3. `next_tool_args` (dict)\n"
    "Lay out every message with `[[ ## field ## ]]` headers. Your task: reach the answer with the tools."
)
_REACT_CLOSE = (
    "Answer with `[[ ## next_thought ## ]]`, then `[[ ## next_tool_name ## ]]`, then `[[ ## next_tool_args ## ]]`,"
    " then `[[ ## completed ## ]]`."
)


def dspy_react() -> list[Call]:
    """`prompt_rebuilt`: DSPy's `ReAct`, whose every step is one fresh chat prompt: the same system
    message, and a user message rendering the question and the whole trajectory so far (each step's
    thought, tool, arguments and observation as numbered fields). The model's earlier answers never go
    back as assistant messages; their words reappear inside the rewritten user message."""
    question = "[[ ## question ## ]]\nWho designed the Eiffel Tower's lattice?\n\n"
    steps = [
        ("I should search for who designed the tower.", "search", {"query": "Eiffel Tower design"}),
        ("The search names the engineers; I can finish.", "finish", {}),
    ]
    observations = ["Maurice Koechlin and Emile Nouguier drew the first design."]
    calls: list[Call] = []
    trajectory = ""
    for n, (thought, tool, arguments) in enumerate(steps):
        user = question + f"[[ ## trajectory ## ]]\n{trajectory}\n\n" + _REACT_CLOSE
        reply = (
            f"[[ ## next_thought ## ]]\n{thought}\n\n[[ ## next_tool_name ## ]]\n{tool}\n\n"
            f"[[ ## next_tool_args ## ]]\n{json.dumps(arguments)}\n\n[[ ## completed ## ]]"
        )
        calls.append(
            (
                [{"role": "system", "content": _REACT_SYSTEM}, {"role": "user", "content": user}],
                {"role": "assistant", "content": reply},
            )
        )
        if n < len(observations):
            trajectory += (
                f"[[ ## thought_{n} ## ]]\n{thought}\n\n[[ ## tool_name_{n} ## ]]\n{tool}\n\n"
                f"[[ ## tool_args_{n} ## ]]\n{json.dumps(arguments)}\n\n[[ ## observation_{n} ## ]]\n{observations[n]}\n\n"
            )
    return calls


def strands_stateful_responses() -> list[Call]:
    """`history_sent_twice` with the system prompt as `instructions`: strands' Responses model with
    `stateful=True` sends `previous_response_id` and still the whole conversation as `input`, with its
    system prompt as `instructions`. This server expands the stored conversation first (the previous
    `instructions` are not carried), so the history comes twice; the chat messages below are the
    server's own translation of those requests."""
    instructions = "You are a weather agent."
    tools = [
        {
            "type": "function",
            "name": "forecast",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
    ]
    question = {"role": "user", "content": [{"type": "input_text", "text": "Weather in Lyon?"}]}
    call_item = {"type": "function_call", "call_id": "call_1", "name": "forecast", "arguments": '{"city": "Lyon"}'}
    result = {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 24C"}

    def chat(input_items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        body = {"model": "m", "instructions": instructions, "input": input_items, "tools": tools}
        messages: list[dict[str, Any]] = responses_to_chat(body).body["messages"]
        return messages

    first = chat([question])
    # The stored conversation (its input and output), then the request's own input: all of it again.
    second = chat([question, call_item, *[question, call_item, result]])
    return [
        (first, _tool_call(1, "forecast", {"city": "Lyon"})),
        (second, {"role": "assistant", "content": "Sunny and 24C in Lyon."}),
    ]


# Every fixture, by the kind of break it makes (each break of its session is that kind).
FIXTURES: dict[str, Callable[[], list[Call]]] = {
    "compacted": pydantic_ai_condensed,
    "new_conversation": pydantic_ai_two_runs,
    "retried_with_new_system_prompt": dspy_adapter_retry,
    "prompt_rebuilt": dspy_react,
    "history_sent_twice": strands_stateful_responses,
}
