"""`chatpage serve`: the engine behind an OpenAI-compatible API (needs the `serve` extra)."""

from __future__ import annotations

import argparse
import os
import sys

from chatpage.cli.common import add_engine_args, device_error, settings_or_warn, size_arg
from chatpage.config.personas import load_personas
from chatpage.engine.config import EngineConfig

API_KEY_ENV = "CHATPAGE_API_KEY"


def cmd_serve(args) -> int:
    try:
        import uvicorn

        from chatpage.serve import build_app
        from chatpage.serve.limits import ServeLimits
    except ImportError as e:
        print(
            f"chatpage: error: chatpage serve needs the serve extra ({e.name} is missing); "
            "install it with: pip install 'chatpage[serve]'",
            file=sys.stderr,
        )
        return 2
    from chatpage.engine.client import EngineStatus, LocalEngineClient, StatusKind

    try:
        given = {"max_body_bytes": args.max_body, "body_timeout_s": args.body_timeout}
        limits = ServeLimits(**{k: v for k, v in given.items() if v is not None})
    except ValueError as e:
        print(f"chatpage: error: {e}", file=sys.stderr)
        return 2
    settings = settings_or_warn(args)
    if (error := device_error(settings)) is not None:
        print(f"chatpage: error: {error}", file=sys.stderr)
        return 2
    personas, errors = load_personas()
    for err in errors:
        print(f"chatpage: warning: {err}", file=sys.stderr)
    client = LocalEngineClient(settings.model, EngineConfig.for_settings(settings, args.threads))

    def status(line: EngineStatus) -> None:
        print(f"chatpage serve: {line}", file=sys.stderr, flush=True)
        if line.kind is StatusKind.READY:  # how its tool calls and thinking are read
            print(f"chatpage serve: {client.reading()}", file=sys.stderr, flush=True)

    client.start(status)
    for prompt in dict.fromkeys(p.system_prompt for p in personas):
        client.pin_system_prompt(prompt)
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    app = build_app(client, api_key, personas, args.host, limits)
    print(
        f"chatpage serve: http://{args.host}:{args.port}/v1 (OpenAI-compatible; "
        f"{'API key required' if api_key else 'no API key'})",
        file=sys.stderr,
        flush=True,
    )
    try:
        uvicorn.run(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            timeout_graceful_shutdown=2,
        )
    finally:
        client.close()
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument(
        "--api-key",
        help=f"require 'Authorization: Bearer KEY' on /v1 (default: ${API_KEY_ENV}, else none)",
    )
    serve.add_argument(
        "--max-body",
        type=size_arg,
        metavar="SIZE",
        help="largest request body taken; larger ones get a 413 (default 4MiB)",
    )
    serve.add_argument(
        "--body-timeout",
        type=float,
        metavar="SECONDS",
        help="how long a client may take to send its body before a 408 (default 30)",
    )
    serve.add_argument("--model", help="HF model directory or .gguf file")
    serve.add_argument("--kv-cache", type=size_arg, metavar="SIZE", help="KV cache budget")
    add_engine_args(serve)
    serve.add_argument(
        "--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"]
    )
    serve.set_defaults(func=cmd_serve)
