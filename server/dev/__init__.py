"""Development tools: the demo and the mock upstream (a scripted vLLM-compatible server).

Its public surface is its modules (`__all__`): the mock upstream is a package below this one, and
re-exporting `demo` here would make every process that starts the mock import the demo and httpx too.
"""

__all__ = ["demo"]
