"""Development tools: the demo and the mock upstream (a scripted vLLM-compatible server).

Its public surface is its modules (`__all__`): re-exporting `demo` here would load the OpenAI SDK in
every process that starts the mock upstream.
"""

__all__ = ["demo"]
