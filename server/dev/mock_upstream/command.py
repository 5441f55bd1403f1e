"""The mock upstream's command line, for `python -m server.dev.mock_upstream` and `switchyard-model mock-upstream`."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser, *, port: int) -> None:
    """The mock's options, shared by both ways of starting it (`port` is each one's default)."""
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=port)
    parser.add_argument("--model-name", default="mock-model", help="the model id it reports")
    parser.add_argument("--max-model-len", type=int, default=32768, help="the context length it reports and enforces")
    parser.add_argument(
        "--template",
        choices=["keep-reasoning", "drop-reasoning"],
        default="keep-reasoning",
        help="drop-reasoning: past assistant turns render without their reasoning (Qwen3-like)",
    )
    parser.add_argument(
        "--token-in",
        choices=["honor", "ignore"],
        default="honor",
        help="honor or ignore prompt ids sent in kv_transfer_params / input_ids / required_prefix_token_ids",
    )


def serve(args: argparse.Namespace) -> None:
    """Serve until interrupted (imported here: building the CLI's parser must not load the app)."""
    from server.dev.mock_upstream.app import run

    run(
        args.host,
        args.port,
        model_name=args.model_name,
        max_model_len=args.max_model_len,
        template=args.template,
        token_in=args.token_in,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m server.dev.mock_upstream",
        description="A deterministic vLLM-compatible chat model server for the demo, tests and benchmarks.",
    )
    add_arguments(parser, port=8000)
    serve(parser.parse_args(argv))
