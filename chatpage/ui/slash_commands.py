"""What each slash command does in the app (parsing lives in `chatpage.chat.commands`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from chatpage.chat.commands import (
    SETTING_COMMANDS,
    Command,
    parse_compare,
    parse_k,
    read_attachment,
)
from chatpage.chat.sampling import SETTING_BY_FIELD, AltMode
from chatpage.config.personas import find_persona
from chatpage.ui import history
from chatpage.ui.history import EXPORT_NAMES

if TYPE_CHECKING:
    from chatpage.ui.app import ChatApp


def _setting_value(value: object) -> str:
    return "off" if value is None else str(value)


async def run_slash_command(app: ChatApp, command: Command) -> None:
    """Run ``command`` on the app's current session; a ValueError is a one-line problem."""
    session, name, arg = app.current, command.name, command.arg
    if session is None:
        return
    chats = app.chats
    if name in SETTING_COMMANDS:
        field = SETTING_COMMANDS[name]
        info = SETTING_BY_FIELD[field]
        if not arg:
            app.say(f"{info.label} is {_setting_value(getattr(session.sampling, field))} "
                    f"(set it with /{name} VALUE: {info.allowed})")
            return
        chats.set_setting(session, field, arg)
        app.say(f"{info.label} set to {_setting_value(getattr(session.sampling, field))}")
    elif name in ("samples", "beam"):
        chats.set_alt_mode(session, AltMode(name, parse_k(arg, name)))
        app.say(f"next reply: {session.alt_mode.describe()}, side by side")
    elif name == "single":
        chats.set_alt_mode(session, AltMode(k=session.alt_mode.k))
    elif name == "compare":
        chats.compare(session, *parse_compare(arg))
    elif name == "keep":
        if not arg.isdigit():
            raise ValueError(f"use /keep N with N the pane's number, got {arg!r}")
        chats.keep(session, int(arg))
    elif name == "file":
        attachment = read_attachment(arg, app.client.max_model_len or None)
        chats.attach(session, attachment)
        app.say(f"attached {attachment.name} to your next message")
    elif name == "detach":
        chats.detach(session)
    elif name == "new" and arg:
        persona = find_persona(app.personas, arg)
        if persona is None:
            names = ", ".join(p.name for p in app.personas)
            raise ValueError(f"no persona named {arg!r}; the personas are: {names}")
        await app.open_session(persona)
    elif name == "title":
        if not arg:
            raise ValueError("give the new title: /title TEXT")
        chats.rename(session, arg)
    elif name == "search":
        history.search(app, arg)
    elif name == "export":
        fmt = arg.lower().lstrip(".") or "md"
        if fmt not in EXPORT_NAMES:
            raise ValueError(f"use /export md or /export json, got {arg!r}")
        history.export(app, fmt)
    elif name == "copy":
        app.action_copy_code() if arg.lower().startswith("code") else app.action_copy_reply()
    elif name == "clear":
        chats.clear(session)
    else:
        actions = {"help": app.action_help, "stop": app.action_stop,
                   "regen": app.action_regenerate, "edit": app.action_edit_last,
                   "settings": app.action_sampling_settings, "new": app.action_new_session,
                   "quit": app.exit}
        actions[name]()
