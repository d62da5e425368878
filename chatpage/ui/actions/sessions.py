"""Handlers of the actions on the chats themselves: open, close, move between, find, export,
delete; and the app's own (help, the model, quit)."""

from __future__ import annotations

from chatpage.chat.session import ChatSession
from chatpage.config.personas import Persona, find_persona
from chatpage.ui.actions.action import Controls, Handler, on_chat
from chatpage.ui.history import EXPORT_NAMES
from chatpage.ui.screens.chat_search import ChatSearch
from chatpage.ui.screens.confirm import Confirm
from chatpage.ui.screens.persona_picker import PersonaPicker
from chatpage.ui.screens.tools_list import ToolsList, tools_text
from chatpage.vocab import UserError


def persona_named(personas: list[Persona], name: str) -> Persona:
    """The persona called ``name``; UserError listing the names when there is none."""
    persona = find_persona(personas, name)
    if persona is None:
        names = ", ".join(p.name for p in personas)
        raise UserError(f"no persona named {name!r}; the personas are: {names}")
    return persona


async def new_session(c: Controls, arg: str | None) -> None:
    """A new chat with the persona named, else the one picked."""
    if arg:
        await c.open_session(persona_named(c.personas, arg))
        return

    async def pick() -> None:
        persona = await c.ask(PersonaPicker(c.personas, c.default_persona()))
        if persona is not None:
            await c.open_session(persona)

    c.dialog(pick)


@on_chat
async def close_session(c: Controls, session: ChatSession, arg: str | None) -> None:
    """Close the chat on show; it stays saved (see `chatpage.ui.history`)."""
    await c.close_session(session)


@on_chat
async def delete_session(c: Controls, session: ChatSession, arg: str | None) -> None:
    """Ask, then delete the chat on show from the store and close it."""

    async def confirm() -> None:
        saved = (
            "It is removed from the saved chats; this cannot be undone."
            if session.store_id is not None
            else "It has no messages yet."
        )
        yes = await c.ask(Confirm(f"Delete the chat {session.title!r}?", saved, "Delete"))
        if yes and session in c.chats.sessions:
            c.saved.delete(session)
            await c.close_session(session)
            c.say(f"deleted the chat {session.title!r}")

    c.dialog(confirm)


def step(by: int) -> Handler:
    """Show the next (+1) or previous (-1) chat."""

    async def run(c: Controls, arg: str | None) -> None:
        c.step(by)

    return run


def goto(number: int) -> Handler:
    """Show chat ``number`` (from 1, in the sidebar's order), if there is one."""

    async def run(c: Controls, arg: str | None) -> None:
        if 1 <= number <= len(c.chats.sessions):
            c.current = c.chats.sessions[number - 1]

    return run


async def search(c: Controls, arg: str | None) -> None:
    """The search dialog over the saved chats (``arg``: the words to start with); the hit
    picked opens its chat."""

    async def find() -> None:
        hit = await c.ask(ChatSearch(c.saved.store.search, arg or ""))
        if hit is not None:
            c.open_saved(hit.session_id)

    c.dialog(find)


@on_chat
async def export(c: Controls, session: ChatSession, arg: str | None) -> None:
    fmt = (arg or "").lower().lstrip(".") or "md"
    if fmt not in EXPORT_NAMES:
        raise UserError(f"use /export md or /export json, got {arg!r}")
    c.saved.export(session, fmt)


@on_chat
async def rename(c: Controls, session: ChatSession, arg: str | None) -> None:
    if not arg:
        raise UserError("give the new title: /title TEXT")
    c.chats.rename(session, arg)


@on_chat
async def clear(c: Controls, session: ChatSession, arg: str | None) -> None:
    c.chats.clear(session)


async def switch_model(c: Controls, arg: str | None) -> None:
    """The model at ``arg`` ("default": the default model), else the one picked."""
    c.switch_model(("" if arg.lower() == "default" else arg) if arg else None)


async def show_help(c: Controls, arg: str | None) -> None:
    c.show_help()


async def quit_app(c: Controls, arg: str | None) -> None:
    c.quit()


async def interrupt(c: Controls, arg: str | None) -> None:
    c.interrupt()


async def show_tools(c: Controls, arg: str | None) -> None:
    """The MCP servers, their state and their tools."""

    async def show() -> None:
        await c.ask(ToolsList(tools_text(c.chats.requests.tool_loop.servers, c.current)))

    c.dialog(show)
