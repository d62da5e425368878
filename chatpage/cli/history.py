"""`chatpage history | history search | export | import`: saved chats from the command line.

`register(subparsers)` adds the subcommands; each sets ``func`` to a handler that takes the
parsed args and returns the exit code (0 ok, 1 failed; argparse itself exits 2 on bad usage).
Errors are one line on stderr.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from chatpage.cli.common import one_line, print_table
from chatpage.store import Store
from chatpage.store.io import export_session, import_json, local_time, write_whole

PROG = "chatpage"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `history` (with `history search`), `export` and `import` to a parser."""
    history = subparsers.add_parser(
        "history",
        help="list saved chats",
        description="List saved chats, most recent first; `history search TERM` searches them.",
    )
    history.set_defaults(func=cmd_history)
    history_sub = history.add_subparsers(dest="history_command", metavar="{search}")
    search = history_sub.add_parser(
        "search",
        help="search the text of saved chats",
        description="Find messages containing every word of TERM (case and accents ignored).",
    )
    search.add_argument("term", nargs="+", metavar="TERM", help="words to look for")
    search.set_defaults(func=cmd_search)

    export = subparsers.add_parser(
        "export",
        help="write a saved chat as Markdown or JSON",
        description="Write a saved chat as Markdown (to read) or JSON (to import again).",
    )
    export.add_argument("session", type=int, metavar="SESSION", help="chat id (see `history`)")
    export.add_argument(
        "-f", "--format", choices=("md", "json"), default="md", help="output format (default: md)"
    )
    export.add_argument(
        "-o", "--output", type=Path, metavar="FILE", help="write to FILE instead of standard output"
    )
    export.set_defaults(func=cmd_export)

    imp = subparsers.add_parser(
        "import",
        help="add a chat from a JSON export",
        description="Add a chat from a file written by `export --format json`.",
    )
    imp.add_argument("file", type=Path, metavar="FILE.json")
    imp.set_defaults(func=cmd_import)


def _fail(message: str, code: int = 1) -> int:
    print(f"{PROG}: error: {one_line(message)}", file=sys.stderr)
    return code


def _open_store() -> Store:
    store = Store.open()
    if store.notice:
        print(f"{PROG}: {store.notice}", file=sys.stderr)
    return store


def cmd_history(args: argparse.Namespace) -> int:
    """List saved chats: id, last update, persona, message count, title."""
    with _open_store() as store:
        sessions = store.list_sessions()
    if not sessions:
        print("No saved chats yet.")
        return 0
    print_table(
        ("ID", "UPDATED", "PERSONA", "MESSAGES", "TITLE"),
        (
            (
                str(s.id),
                local_time(s.updated_at),
                one_line(s.persona),
                str(s.message_count),
                one_line(s.title),
            )
            for s in sessions
        ),
    )
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    """Print the messages matching the search words, with their chat and a snippet."""
    term = " ".join(args.term)
    with _open_store() as store:
        hits = store.search(term)
    if not hits:
        print(f"No messages match {term!r}.")
        return 0
    print_table(
        ("ID", "CHAT", "ROLE", "SNIPPET"),
        ((str(h.session_id), one_line(h.session_title), h.role, one_line(h.snippet)) for h in hits),
    )
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """Write one chat as Markdown or JSON to stdout or to --output."""
    with _open_store() as store:
        try:
            text = export_session(store, args.session, args.format)
        except KeyError:
            return _fail(f"no chat with id {args.session}; `{PROG} history` lists them")
    if args.output is None:
        sys.stdout.write(text)
        return 0
    try:
        write_whole(args.output, text)
    except OSError as err:
        return _fail(f"cannot write {args.output}: {err.strerror or err}")
    print(f"Exported chat {args.session} to {args.output}.", file=sys.stderr)
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    """Add a chat from a JSON export; prints the new chat's id."""
    try:
        text = args.file.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return _fail(f"{args.file}: not UTF-8 text; is it a JSON export?")
    except OSError as err:
        return _fail(f"cannot read {args.file}: {err.strerror or err}")
    with _open_store() as store:
        if not store.persistent:
            return _fail("nothing was imported because chats cannot be saved (see above)")
        try:
            session_id = import_json(store, text)
        except ValueError as err:
            return _fail(f"{args.file}: {err}")
        row = store.get_session(session_id)
    if row is None:
        return _fail(f"{args.file}: the imported chat {session_id} cannot be read back")
    print(f"Imported chat {session_id}: {one_line(row.title)}")
    return 0
