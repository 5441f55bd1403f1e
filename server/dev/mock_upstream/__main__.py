"""`python -m server.dev.mock_upstream`: serve the mock upstream on a host and port."""

from __future__ import annotations

import argparse

from server.dev.mock_upstream.app import run


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m server.dev.mock_upstream",
        description="A deterministic vLLM-compatible chat model server for the demo, tests and benchmarks.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model-name", default="mock-model")
    parser.add_argument("--max-model-len", type=int, default=32768)
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
    args = parser.parse_args(argv)
    run(
        args.host,
        args.port,
        model_name=args.model_name,
        max_model_len=args.max_model_len,
        template=args.template,
        token_in=args.token_in,
    )


if __name__ == "__main__":
    main()
