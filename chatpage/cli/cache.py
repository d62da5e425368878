"""`chatpage cache` and `chatpage cache clear`: the KV disk tier (prefilled prompts kept across
restarts, engine/core/kv_tiers.py): where it is, what it holds against its bound, and clearing it."""

from __future__ import annotations

import argparse
import sys

from chatpage.config.paths import kv_dir
from chatpage.config.settings import format_size, load_settings


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `cache` (with `cache clear`) to a parser."""
    cache = subparsers.add_parser(
        "cache",
        help="show the KV disk tier (prompts prefilled once, kept across restarts)",
        description="Show where the KV disk tier is and what it holds; `cache clear` empties it.",
    )
    cache.set_defaults(func=cmd_cache)
    sub = cache.add_subparsers(dest="cache_command", metavar="{clear}")
    clear = sub.add_parser(
        "clear",
        help="remove every KV block kept on disk",
        description="Remove every KV block the disk tier holds (every model's); chats, models "
        "and settings stay.",
    )
    clear.set_defaults(func=cmd_clear)


def cmd_cache(args: argparse.Namespace) -> int:
    from chatpage.engine.core.kv_tiers import tier_usage  # imports torch

    settings, warnings = load_settings()
    for warning in warnings:
        print(f"chatpage: {warning}", file=sys.stderr)
    root = kv_dir()
    usage = tier_usage(root)
    bound = format_size(settings.kv_disk) if settings.kv_disk else "0 (the tier is off)"
    print(f"KV disk tier: {root}")
    print(f"  holds {format_size(usage.bytes)} of kv_disk {bound}")
    print(f"  {usage.files} blocks of {usage.namespaces} model/format namespace(s)")
    print("  `chatpage cache clear` removes them; kv_disk: 0 in config.yaml turns the tier off")
    return 0


def cmd_clear(args: argparse.Namespace) -> int:
    from chatpage.engine.core.kv_tiers import clear_tier  # imports torch

    root = kv_dir()
    freed = clear_tier(root)
    print(f"removed {format_size(freed)} of KV blocks from {root}")
    return 0
