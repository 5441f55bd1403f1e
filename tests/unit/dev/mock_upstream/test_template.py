"""The mock chat template: arguments rendered canonically, tools in the first system block."""

from __future__ import annotations

from server.dev.mock_upstream.template import canonical_arguments, render_prompt
from tests.support.mock_chat import SYSTEM, TOOLS, user


def test_template_renders_arguments_canonically() -> None:
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "bash", "arguments": '{"command": "ls",  "n": [1, 2]}'},
    }
    compact = {**call, "function": {"name": "bash", "arguments": '{"command":"ls","n":[1,2]}'}}
    base = [SYSTEM, user("hi")]
    spaced = render_prompt([*base, {"role": "assistant", "content": "", "tool_calls": [call]}], TOOLS)
    tight = render_prompt([*base, {"role": "assistant", "content": None, "tool_calls": [compact]}], TOOLS)
    assert spaced == tight
    assert '<tool_call>\n{"name":"bash","arguments":{"command":"ls","n":[1,2]}}\n</tool_call>' in spaced
    assert canonical_arguments("not json") == '"not json"'
    # Tools go into the first system block; the prompt ends with the generation prompt.
    assert spaced.startswith("<|im_start|>system\nYou are a coding agent. Be brief.\n\n# Tools")
    assert spaced.endswith("<|im_end|>\n<|im_start|>assistant\n")
