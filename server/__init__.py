"""switchyard-model: an OpenAI-compatible model server in front of a Switchyard routing proxy."""

__version__ = "0.1.0"
