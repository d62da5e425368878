"""What each slash command does on the chat screen (parsing lives in `chatpage.chat.commands`).

It is handed the screen's controls (`SlashHost`), not the app.
"""

from __future__ import annotations

from typing import Any, Protocol

from chatpage.chat.chats import Chats
from chatpage.chat.commands import (
    SETTING_COMMANDS,
    Command,
    parse_compare,
    parse_k,
    read_attachment,
)
from chatpage.chat.sampling import SETTING_BY_FIELD, AltMode
from chatpage.chat.session import ChatSession
from chatpage.config.personas import Persona, find_persona
from chatpage.ui.history import EXPORT_NAMES

_ACTIONS = {"help": "app.help", "stop": "stop", "regen": "regenerate", "edit": "edit_last",
            "settings": "sampling_settings", "new": "new_session", "quit": "app.quit",
            "persona": "switch_persona", "model": "app.switch_model"}
"""Commands that only run a bound action (of the chat screen, or ``app.``)."""


class SlashHost(Protocol):
    """What slash commands act on (the chat screen)."""

    chats: Chats
    personas: list[Persona]
    current: ChatSession | None

    def say(self, message: str, severity: str = "information",
            timeout: float | None = None) -> None: ...
    ModelWanted: Any

    async def run_action(self, action: str) -> Any: ...
    def post_message(self, message: Any) -> bool: ...
    def set_system_prompt(self, session: ChatSession, text: str) -> None: ...
    def edit_system_prompt(self) -> Any: ...
    def switch_persona(self, session: ChatSession, persona: Persona) -> None: ...
    def action_save_as_persona(self, name: str = "") -> Any: ...
    async def open_session(self, persona: Persona) -> ChatSession: ...
    def search(self, term: str) -> Any: ...
    def action_export(self, fmt: str) -> Any: ...


def _setting_value(value: object) -> str:
    return "off" if value is None else str(value)


async def run_slash_command(host: SlashHost, command: Command) -> None:
    """Run ``command`` on the host's current session; a ValueError is a one-line problem."""
    session, name, arg = host.current, command.name, command.arg
    if session is None:
        return
    chats = host.chats
    if name in SETTING_COMMANDS:
        field = SETTING_COMMANDS[name]
        info = SETTING_BY_FIELD[field]
        if not arg:
            host.say(f"{info.label} is {_setting_value(getattr(session.sampling, field))} "
                     f"(set it with /{name} VALUE: {info.allowed})")
            return
        chats.set_setting(session, field, arg)
        host.say(f"{info.label} set to {_setting_value(getattr(session.sampling, field))}")
    elif name in ("samples", "beam"):
        chats.set_alt_mode(session, AltMode(name, parse_k(arg, name)))
        host.say(f"next reply: {session.alt_mode.describe()}, side by side")
    elif name == "single":
        chats.set_alt_mode(session, AltMode(k=session.alt_mode.k))
    elif name == "compare":
        chats.compare(session, *parse_compare(arg))
    elif name == "keep":
        if not arg.isdigit():
            raise ValueError(f"use /keep N with N the pane's number, got {arg!r}")
        chats.keep(session, int(arg))
    elif name == "file":
        attachment = read_attachment(arg, chats.client.max_model_len or None)
        chats.attach(session, attachment)
        host.say(f"attached {attachment.name} to your next message")
    elif name == "detach":
        chats.detach(session)
    elif name == "new" and arg:
        await host.open_session(persona_named(host.personas, arg))
    elif name == "title":
        if not arg:
            raise ValueError("give the new title: /title TEXT")
        chats.rename(session, arg)
    elif name == "search":
        host.search(arg)
    elif name == "export":
        fmt = arg.lower().lstrip(".") or "md"
        if fmt not in EXPORT_NAMES:
            raise ValueError(f"use /export md or /export json, got {arg!r}")
        host.action_export(fmt)
    elif name == "copy":
        await host.run_action("copy_code" if arg.lower().startswith("code") else "copy_reply")
    elif name == "clear":
        chats.clear(session)
    elif name == "continue":
        chats.continue_reply(session)
    elif name == "system":
        host.set_system_prompt(session, arg) if arg else host.edit_system_prompt()
    elif name == "persona" and arg:
        host.switch_persona(session, persona_named(host.personas, arg))
    elif name == "model" and arg:
        host.post_message(host.ModelWanted("" if arg.lower() == "default" else arg))
    elif name == "saveas":
        host.action_save_as_persona(arg)
    else:
        await host.run_action(_ACTIONS[name])


def persona_named(personas: list[Persona], name: str) -> Persona:
    """The persona called ``name``; ValueError listing the names when there is none."""
    persona = find_persona(personas, name)
    if persona is None:
        names = ", ".join(p.name for p in personas)
        raise ValueError(f"no persona named {name!r}; the personas are: {names}")
    return persona
