"""Command-line flags of the emulator (`memci-proxy emulate ...`, `python -m memci_proxy.emulator ...`)."""

from __future__ import annotations

import argparse
import sys

from memci_proxy.emulator.config import EmulatorConfig
from memci_proxy.listen_check import PortInUse, ensure_free


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = EmulatorConfig()
    parser.add_argument("--host", default=defaults.host, help="address to listen on (default %(default)s)")
    parser.add_argument("--port", type=int, default=defaults.port, help="port to listen on (default %(default)s)")
    parser.add_argument("--model", default=defaults.model, help="model name served (default %(default)s)")
    parser.add_argument(
        "--max-model-len", type=int, default=defaults.max_model_len, help="context length in tokens (default %(default)s)"
    )
    parser.add_argument(
        "--lenient-context", action="store_true",
        help="accept prompt + max_tokens over the context length (max_tokens cut to the window's rest); by default "
             "such a request is a 400, as vLLM and SGLang answer it",
    )
    parser.add_argument(
        "--refuse", action="append", default=[], choices=("null_content", "tool_messages"),
        help="refuse a message shape as some servers do: null_content (500, as llama-cpp-python's server), "
             "tool_messages (400, a server without tools); may be repeated",
    )
    parser.add_argument(
        "--model-dir", default=None, metavar="DIR",
        help="a Hugging Face model's directory (tokenizer.json and its chat template): render and count prompts as "
             "that model's server does, to compare cache figures with it (needs the tokenizers package)",
    )
    parser.add_argument(
        "--cache-tokens",
        type=int,
        default=defaults.cache_capacity_tokens,
        help="radix cache capacity in tokens (default %(default)s)",
    )
    parser.add_argument(
        "--per-uncached-token", type=float, default=0.0, help="seconds per uncached prompt token before the first token"
    )
    parser.add_argument(
        "--per-cached-token", type=float, default=0.0, help="seconds per cached prompt token before the first token"
    )
    parser.add_argument("--per-output-token", type=float, default=0.0, help="seconds per output token")
    parser.add_argument(
        "--embedding-dim", type=int, default=defaults.embedding_dim, help="embedding dimension (default %(default)s)"
    )
    parser.add_argument(
        "--answer-tokens",
        type=int,
        default=defaults.default_answer_tokens,
        help="default answer length in tokens (default %(default)s)",
    )


def config_from_args(args: argparse.Namespace) -> EmulatorConfig:
    return EmulatorConfig(
        host=args.host,
        port=args.port,
        model=args.model,
        max_model_len=args.max_model_len,
        strict_context=not getattr(args, "lenient_context", False),
        refuse=tuple(getattr(args, "refuse", None) or ()),
        model_dir=getattr(args, "model_dir", None),
        cache_capacity_tokens=args.cache_tokens,
        embedding_dim=args.embedding_dim,
        per_uncached_token_s=args.per_uncached_token,
        per_cached_token_s=args.per_cached_token,
        per_output_token_s=args.per_output_token,
        default_answer_tokens=getattr(args, "answer_tokens", EmulatorConfig.default_answer_tokens),
    )


def run_from_args(args: argparse.Namespace) -> None:
    """Serve; PortInUse (memci_proxy.listen_check) when another process listens on the port."""
    from memci_proxy.emulator.server import run

    config = config_from_args(args)
    ensure_free(config.host, config.port, "the emulator")
    run(config)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m memci_proxy.emulator", description="Memci upstream emulator")
    add_arguments(parser)
    try:
        run_from_args(parser.parse_args(argv))
    except PortInUse as exc:
        sys.exit(f"python -m memci_proxy.emulator: {exc}")
