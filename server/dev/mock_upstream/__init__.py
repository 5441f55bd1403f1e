"""A deterministic vLLM-compatible chat model server, scripted by `[[mock:...]]` directives (docs/mock-upstream.md).

One module per job: tokenizer, template, directives, generation (the reply), replies (bodies and
stream chunks), state (caches, counters, validation) and app (the ASGI endpoints); run it with
`python -m server.dev.mock_upstream`; other packages start it through `command` (`__all__`).
"""

__all__ = ["command"]
