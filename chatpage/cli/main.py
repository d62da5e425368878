"""`chatpage`: the TUI by default; `ask`, `personas`, `bench`, `history`, `export`, ... subcommands."""

from __future__ import annotations

import argparse
import sys

from chatpage.cli import ask, bench, cache, pull, serve
from chatpage.cli import config as config_cli
from chatpage.cli import history as history_cli
from chatpage.cli.common import (
    add_backend_args,
    add_engine_args,
    device_error,
    load_with_overrides,
    remote_client,
    size_arg,
)
from chatpage.config.personas import load_personas
from chatpage.engine.config import EngineConfig


# -- chatpage (the TUI) ----------------------------------------------------------------------------
def cmd_tui(args) -> int:
    from chatpage.ui.app import ChatApp

    settings, warnings = load_with_overrides(args)  # shown as notices inside the app
    if (error := device_error(settings)) is not None:
        print(f"chatpage: error: {error}", file=sys.stderr)
        return 2
    client = remote_client(settings) if settings.backend else None
    ChatApp(
        model=settings.model,
        config=EngineConfig.for_settings(settings, args.threads),
        settings=settings,
        warnings=warnings,
        client=client,
    ).run()
    return 0


# -- chatpage personas ------------------------------------------------------------------------------
def cmd_personas(args) -> int:
    personas, errors = load_personas()
    for p in personas:
        print(f"{p.name:<14} {p.description}  [{p.source}]")
    for err in errors:
        print(f"error: {err}", file=sys.stderr)
    return 1 if errors else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chatpage",
        description="Chat in the terminal with a local model served by a paged KV-cache engine.",
    )
    parser.add_argument("--model", help="HF model directory or .gguf file (default: SmolLM2-135M)")
    parser.add_argument(
        "--kv-cache", type=size_arg, metavar="SIZE", help="KV cache budget, e.g. 512MiB or 2G"
    )
    add_backend_args(
        parser,
        "use an OpenAI-compatible server (vLLM, SGLang, llama-server, "
        "chatpage serve) instead of the local engine",
    )
    add_engine_args(parser)
    parser.set_defaults(func=cmd_tui)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    personas = sub.add_parser("personas", help="list the personas and any broken persona files")
    personas.set_defaults(func=cmd_personas)

    ask.register(sub)
    bench.register(sub)
    serve.register(sub)
    history_cli.register(sub)
    config_cli.register(sub)
    pull.register(sub)
    cache.register(sub)
    _keep_global_values(parser, sub)
    return parser


def _keep_global_values(parser: argparse.ArgumentParser, sub: argparse._SubParsersAction) -> None:
    """A command's own copy of a global option (``ask --model``, ``serve --threads``...) takes
    no default: unset after the command, the value given before it stands (argparse would
    otherwise put the command's default None over ``chatpage --model X ask``'s X)."""
    globals_ = {a.dest for a in parser._actions}
    for command in sub.choices.values():
        for action in command._actions:
            if action.dest in globals_ and action.dest != "help":
                action.default = argparse.SUPPRESS


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
