"""Handlers of the actions on the chat on show: its replies, the message box, copying, moving
through the messages."""

from __future__ import annotations

import asyncio

from chatpage.chat.commands import read_attachment
from chatpage.chat.session import ChatSession
from chatpage.ui.actions.action import Controls, Handler, on_chat
from chatpage.ui.text import code_blocks


@on_chat
async def stop(c: Controls, session: ChatSession, arg: str | None) -> None:
    c.chats.requests.stop(session)


@on_chat
async def regenerate(c: Controls, session: ChatSession, arg: str | None) -> None:
    c.chats.regenerate(session)


@on_chat
async def edit_last(c: Controls, session: ChatSession, arg: str | None) -> None:
    c.box.put_back(c.chats.edit(session))


@on_chat
async def cancel_edit(c: Controls, session: ChatSession, arg: str | None) -> None:
    c.chats.cancel_edit(session)
    c.box.put_back("")


@on_chat
async def undo_delete(c: Controls, session: ChatSession, arg: str | None) -> None:
    entry = c.chats.undo_delete(session)
    c.say(f"brought back {'your message' if entry.role == 'user' else 'the reply'}")


@on_chat
async def continue_reply(c: Controls, session: ChatSession, arg: str | None) -> None:
    c.chats.continue_reply(session)


@on_chat
async def attach(c: Controls, session: ChatSession, arg: str | None) -> None:
    attachment = await asyncio.to_thread(  # a slow disk must not hold up the UI
        read_attachment, arg or "", c.chats.requests.client.max_model_len or None
    )
    c.chats.attach(session, attachment)
    c.say(f"attached {attachment.name} to your next message")


@on_chat
async def detach(c: Controls, session: ChatSession, arg: str | None) -> None:
    c.chats.detach(session)


@on_chat
async def copy_reply(c: Controls, session: ChatSession, arg: str | None) -> None:
    """Copy the last reply (``code``: its last code block)."""
    if arg and arg.lower().startswith("code"):
        await copy_code(c, None)
        return
    reply = session.last("assistant")
    if reply is None or not reply.content:
        c.say("there is no reply to copy yet", "warning")
        return
    c.copy_text(reply.content, "reply")


@on_chat
async def copy_code(c: Controls, session: ChatSession, arg: str | None) -> None:
    reply = session.last("assistant")
    blocks = code_blocks(reply.content) if reply is not None else []
    if not blocks:
        c.say("the last reply has no code block", "warning")
        return
    c.copy_text(blocks[-1], "code block")


def focus_step(step: int) -> Handler:
    """Move the focus to the previous (-1) or next (+1) message."""

    @on_chat
    async def run(c: Controls, session: ChatSession, arg: str | None) -> None:
        c.column.focus_message(step)

    return run


@on_chat
async def toggle_thinking(c: Controls, session: ChatSession, arg: str | None) -> None:
    """Open or fold the thinking of the focused reply (else of the last reply that thought)."""
    if not c.column.toggle_thinking():
        c.say("no reply on show has thinking to show", "warning")


async def toggle_sidebar(c: Controls, arg: str | None) -> None:
    c.toggle_sidebar()


async def external_editor(c: Controls, arg: str | None) -> None:
    c.box.edit_draft()
