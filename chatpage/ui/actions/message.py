"""What the keys of a focused message ask for (`MessageView` posts them; the chat screen hands
them here): edit it, ask again for it, delete it, show another version, copy a code block.

Each acts only while the message is still on show in the chat on show.
"""

from __future__ import annotations

from chatpage.chat.entry import Entry
from chatpage.chat.session import ChatSession
from chatpage.ui.actions.action import Controls
from chatpage.ui.screens.code_picker import CodeBlockPicker
from chatpage.ui.screens.confirm import Confirm


def _on_show(c: Controls, entry: Entry, role: str = "", refusal: str = "") -> ChatSession | None:
    """The chat on show, while ``entry`` is on show in it and (given a ``role``) is that
    role's; else None (and ``refusal`` is said when the role is not the one)."""
    session = c.current
    if session is None or entry not in session.entries:
        return None
    if role and entry.role != role:
        c.say(refusal, "warning")
        return None
    return session


def edit(c: Controls, entry: Entry) -> None:
    """Edit a message of yours: it goes back in the box, and sending it forks the chat there
    (what followed the original stays, as the other version)."""
    session = _on_show(
        c, entry, "user", "only your own messages can be edited; ctrl+r asks for another reply"
    )
    if session is not None:
        c.box.put_back(c.chats.edit(session, entry))


def regenerate(c: Controls, entry: Entry) -> None:
    """Ask again for a reply: the new one is another version of it (◀ ▶)."""
    session = _on_show(
        c, entry, "assistant", "r asks again for a reply; e edits a message of yours"
    )
    if session is not None:
        c.chats.regenerate(session, entry)


def delete(c: Controls, entry: Entry) -> None:
    """Ask, then delete a message and everything after it (on every branch)."""
    session = _on_show(c, entry)
    if session is None:
        return

    async def confirm() -> None:
        after = len(session.entries) - session.entries.index(entry) - 1
        undo = (c.key_for("undo_delete") or "").split(",")[0]
        how = f"{undo} or /undo" if undo else "/undo"
        detail = (
            f"The {after} message(s) after it go too, on every branch."
            if after
            else "It is the last message."
        ) + f" {how} brings it back until the chat closes."
        who = "your message" if entry.role == "user" else "this reply"
        if await c.ask(Confirm(f"Delete {who}?", detail, "Delete")):
            if session in c.chats.sessions and entry in session.entries:
                c.chats.delete(session, entry)
                c.say(
                    f"deleted {who}{f' and the {after} after it' if after else ''}: "
                    f"undo with {how}",
                    timeout=12,
                )

    c.dialog(confirm)


def switch(c: Controls, entry: Entry, step: int) -> None:
    """Show another version of a turn (◀ ▶ at a fork)."""
    session = _on_show(c, entry)
    if session is not None:
        c.column.focus_entry(c.chats.switch(session, entry, step))


def copy_code(c: Controls, blocks: list[str]) -> None:
    """Copy one of a message's code blocks (a picker when it has several)."""
    if not blocks:
        c.say("this message has no code block", "warning")
        return

    async def pick() -> None:
        block = blocks[0] if len(blocks) == 1 else await c.ask(CodeBlockPicker(blocks))
        if block is not None:
            c.copy_text(block, "code block")

    c.dialog(pick)
