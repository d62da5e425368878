"""Chats: every open session, and what the user does in them.

A chat is a tree (`chatpage.chat.tree`): editing an earlier message or regenerating a reply adds
a new version of that turn and shows it, keeping every other version (`switch` moves between
them); alternatives left unkept stay as versions too. `continue_reply` lets a reply go on.
Talking to the engine is `Requests`' part.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from chatpage.chat.changes import (
    AttachmentsChanged,
    Cleared,
    Closed,
    EntriesRestored,
    EntryAdded,
    EntryRemoved,
    PathChanged,
    SettingsChanged,
    TitleChanged,
)
from chatpage.chat.entry import Attachment, Entry
from chatpage.chat.mcp import McpServers
from chatpage.chat.requests import ChatError, Requests
from chatpage.chat.sampling import (
    SETTING_BY_FIELD,
    AltKind,
    AltMode,
    SamplingSettings,
    compare_labels,
)
from chatpage.chat.session import (
    MAX_ALTERNATIVES,
    MIN_ALTERNATIVES,
    ChatSession,
    Deletion,
    Observer,
)
from chatpage.chat.tree import below
from chatpage.config.personas import Persona
from chatpage.engine.protocol import EngineClient, UpdateCallback
from chatpage.store import make_title
from chatpage.vocab import MessageStatus

TITLE_WIDTH = 32
_ALT_CYCLE: dict[AltKind, AltKind] = {
    "off": "samples",
    "samples": "beam",
    "beam": "off",
    "compare": "off",
}
CONTINUABLE = (MessageStatus.DONE, MessageStatus.STOPPED, MessageStatus.INTERRUPTED)

__all__ = ["ChatError", "Chats"]


class Chats:
    """The open sessions, in sidebar order, and their `requests` to the engine. `notify` gets
    one-line notices (a turn that had to leave old messages out to fit the context)."""

    def __init__(
        self,
        client: EngineClient[object],
        deliver: UpdateCallback,
        notify: Callable[[str], None] = lambda _line: None,
        tools: McpServers | None = None,
    ) -> None:
        self.requests = Requests(client, deliver, notify, tools)
        self.sessions: list[ChatSession] = []
        self.observers: list[Observer] = []
        """Given to every session opened or adopted from now on (e.g. a store that saves them)."""
        self._next_id = 1
        self.pinned: set[str] = set()
        """System prompts pinned in the engine (see `pin`)."""

    # -- sessions ------------------------------------------------------------------------------
    @property
    def next_id(self) -> int:
        """The id the next new session gets (for building one to `adopt`)."""
        return self._next_id

    def open(self, persona: Persona) -> ChatSession:
        """A new, empty session with ``persona``'s sampling defaults."""
        return self.adopt(ChatSession.new(self._next_id, persona))

    def adopt(self, session: ChatSession) -> ChatSession:
        """Add an existing session (e.g. one restored from the store); ids stay unique."""
        if self.get(session.id) is not None:
            raise ValueError(f"session id {session.id} is already open")
        self._next_id = max(self._next_id, session.id + 1)
        session.observers.extend(o for o in self.observers if o not in session.observers)
        session.context_tokens = self.requests.client.max_model_len
        self.sessions.append(session)
        return session

    def model_ready(self) -> None:
        """The model loaded: every session learns the size of its context window, and which
        of its messages the next turn will leave out (greyed) to fit it."""
        for session in self.sessions:
            self.requests.fit(session, None, notice=False)

    def close(self, session: ChatSession) -> None:
        """Stop what the session is generating (a reply in progress ends "stopped") and
        forget it; observers hear `Closed` last."""
        self.requests.drop(session)
        self.sessions.remove(session)
        session.changed(Closed())

    def get(self, session_id: int) -> ChatSession | None:
        return next((s for s in self.sessions if s.id == session_id), None)

    # -- turns ---------------------------------------------------------------------------------
    def send(self, session: ChatSession, text: str) -> None:
        """Add the user's message (with the pending attachments) and ask for the reply. While
        an earlier message is being edited (`edit`), the message is a new version of it."""
        self.requests.check_idle(session)
        text = text.strip()
        if not text and not session.attachments:
            raise ChatError("the message is empty: type something first")
        entry = Entry("user", text, attachments=list(session.attachments))
        if session.attachments:
            session.attachments = []
            session.changed(AttachmentsChanged())
        edited, session.editing = session.editing, None
        if edited is None:
            session.transcript.append(entry)
        else:
            session.transcript.add_version(edited, entry)
        session.changed(EntryAdded(entry))
        if edited is not None:
            session.changed(PathChanged())
        if session.title == "New chat":
            session.title = make_title(text or entry.attachments[0].name, TITLE_WIDTH)
            session.changed(TitleChanged())
        self.requests.ask(session, entry)

    def regenerate(self, session: ChatSession, reply: Entry | None = None) -> None:
        """Ask again for `reply` (default: the last one on show): the new reply is another
        version of it, shown in its place; the old one and what followed it stay."""
        if session.choosing and not session.streaming:
            self.requests.drop(session)
        self.requests.check_idle(session)
        tip = session.transcript.tip()
        if reply is None and tip is not None and tip.role == "assistant":
            reply = tip
        question = reply.parent if reply is not None else tip
        if question is None or question.role != "user":
            raise ChatError("there is no message to answer yet")
        self.requests.ask(session, question)

    def edit(self, session: ChatSession, message: Entry | None = None) -> str:
        """Start rewriting one of the user's messages (default: the last one on show); returns
        its text for the prompt (its attachments go back to pending). Sending then forks the
        chat there; what followed the original stays as the other version."""
        if message is None:
            message = session.last("user")
        if message is None or message.role != "user":
            raise ChatError("there is no message of yours to edit")
        self.requests.stop(session)
        self.requests.drop(session)
        session.editing = message
        session.attachments = list(message.attachments) + session.attachments
        session.changed(AttachmentsChanged())
        return message.content

    def cancel_edit(self, session: ChatSession) -> None:
        """Stop rewriting the message being edited: the next send is a new turn again, and
        the edited message's attachments leave the pending ones."""
        message, session.editing = session.editing, None
        if message is not None:
            session.attachments = [
                a for a in session.attachments if not any(a is b for b in message.attachments)
            ]
            session.changed(AttachmentsChanged())

    def continue_reply(self, session: ChatSession) -> None:
        """Let the last reply on show (finished, stopped or cut off) go on from where it ended."""
        self.requests.check_idle(session)
        reply = session.transcript.tip()
        if (
            reply is None
            or reply.role != "assistant"
            or reply.status not in CONTINUABLE
            or not reply.content
        ):
            raise ChatError(
                "there is no reply to continue: /continue extends the last reply "
                "once it has stopped or finished"
            )
        self.requests.continue_reply(session, reply)

    def switch(self, session: ChatSession, message: Entry, step: int) -> Entry:
        """Show the version `step` away from `message` (-1: the previous, 1: the next) and
        return it; each version keeps what followed it."""
        self.requests.check_idle(session)
        shown = session.transcript.switch(message, step)
        if shown is not message:
            session.changed(PathChanged())
            self.requests.fit(session, None, notice=False)  # another branch: its own length
        return shown

    def delete(self, session: ChatSession, message: Entry) -> None:
        """Remove `message` and everything after it (on every branch); another version of
        its turn, if any, takes its place."""
        self.requests.check_idle(session)
        if session.editing is not None and session.editing in below(message):
            session.editing = None
        fork = session.transcript.fork_of(message)
        session.deleted.append(Deletion(message, fork.index(message), fork.chosen() is message))
        shown = session.transcript.remove(message)
        session.changed(EntryRemoved(message, shown))

    def undo_delete(self, session: ChatSession) -> Entry:
        """Bring back the message deleted last (with what followed it) where it was; returns
        it. Its rows are written again."""
        self.requests.check_idle(session)
        if not session.deleted:
            raise ChatError("there is no deleted message to bring back")
        deletion = session.deleted.pop()
        session.transcript.restore(deletion.entry, deletion.index, deletion.shown)
        for entry in below(deletion.entry):
            entry.store_id = None  # its rows were deleted: saved anew
        session.changed(EntriesRestored(deletion.entry))
        self.requests.fit(session, None, notice=False)
        return deletion.entry

    def clear(self, session: ChatSession) -> None:
        self.requests.stop(session)
        self.requests.drop(session)
        session.editing = None
        session.deleted.clear()
        session.transcript.clear()
        session.changed(Cleared())

    # -- settings ------------------------------------------------------------------------------
    def set_setting(self, session: ChatSession, name: str, raw: str | float | int | None) -> None:
        """Set one sampling setting from user input (ValueError names it and the rule)."""
        self.set_sampling(session, session.sampling.with_value(name, raw))

    def set_thinking(self, session: ChatSession, arg: str) -> str:
        """``/think on|off``: whether the model thinks before it answers in this chat, where
        its chat template has a switch; says what it did (ChatError where it cannot)."""
        word = arg.strip().lower()
        if word not in ("on", "off"):
            raise ChatError(f"/think takes on or off, got {arg!r}")
        switch = self.requests.thinking_switch()
        session.thinking = word == "on"
        session.changed(SettingsChanged())
        return f"thinking {word} for this chat (the chat template's {switch})"

    def set_speculate(self, session: ChatSession, arg: str) -> str:
        """``/spec on|off``: whether this chat's replies are drafted from the text already
        there and verified in one step (the output is the same either way); says what it did."""
        word = arg.strip().lower()
        if word not in ("on", "off"):
            raise ChatError(f"/spec takes on or off, got {arg!r}")
        session.speculate = word == "on"
        session.changed(SettingsChanged())
        return f"speculative decoding {word} for this chat"

    def set_sampling(self, session: ChatSession, settings: SamplingSettings) -> None:
        settings.params()  # validated before it is kept
        session.sampling = settings
        session.changed(SettingsChanged())

    def set_alt_mode(self, session: ChatSession, mode: AltMode) -> None:
        if mode.kind != "off" and not MIN_ALTERNATIVES <= mode.k <= MAX_ALTERNATIVES:
            raise ChatError(
                f"{mode.kind} must be from {MIN_ALTERNATIVES} to {MAX_ALTERNATIVES}, got {mode.k}"
            )
        session.alt_mode = mode
        session.changed(SettingsChanged())

    def cycle_alt_mode(self, session: ChatSession) -> AltMode:
        """How the next reply is asked for, one step on: single, samples, beam search, single
        (the number of alternatives stays)."""
        mode = session.alt_mode
        self.set_alt_mode(session, AltMode(_ALT_CYCLE[mode.kind], mode.k))
        return session.alt_mode

    def attach(self, session: ChatSession, attachment: Attachment) -> None:
        session.attachments.append(attachment)
        session.changed(AttachmentsChanged())

    def detach(self, session: ChatSession) -> None:
        session.attachments.clear()
        session.changed(AttachmentsChanged())

    def rename(self, session: ChatSession, title: str) -> None:
        session.title = title.strip() or session.title
        session.changed(TitleChanged())

    # -- persona and system prompt -------------------------------------------------------------
    def pin(self, system_prompt: str) -> None:
        """Pin ``system_prompt`` in the engine (once): prefilled once, its blocks shared by
        every chat that starts with it and never evicted."""
        if system_prompt not in self.pinned:
            self.pinned.add(system_prompt)
            self.requests.client.pin_system_prompt(system_prompt)

    def set_system_prompt(self, session: ChatSession, text: str) -> int:
        """Give ``session`` its own system prompt (its persona otherwise unchanged); returns
        how many other open chats start with the same prompt (it is pinned when any does)."""
        text = text.strip()
        if not text:
            raise ChatError(
                "give the new system prompt: /system TEXT (or /system alone to edit it)"
            )
        session.persona = replace(session.persona, system_prompt=text)
        session.changed(SettingsChanged())
        others = sum(s.persona.system_prompt == text for s in self.sessions if s is not session)
        if others:
            self.pin(text)
        return others

    def switch_persona(self, session: ChatSession, persona: Persona) -> None:
        """Continue ``session`` as ``persona``: its system prompt (pinned) and its sampling
        defaults; the tools allowed for good are asked for again (its servers may differ)."""
        session.persona = persona
        session.always_tools.clear()
        session.speculate = persona.speculate
        self.set_sampling(session, SamplingSettings.for_persona(persona))
        self.pin(persona.system_prompt)

    def compare(self, session: ChatSession, name: str, values: list[str]) -> None:
        """Ask for the next reply (as /samples and /beam do; ctrl+r: the last message again)
        once per value of setting ``name``, each in its own pane; the one kept becomes the
        reply, the others its versions. The values are checked now."""
        if not MIN_ALTERNATIVES <= len(values) <= MAX_ALTERNATIVES:
            raise ChatError(
                f"/compare takes {MIN_ALTERNATIVES} to {MAX_ALTERNATIVES} values, got {len(values)}"
            )
        labels = compare_labels(session.sampling, name, values)
        if len(set(labels)) != len(labels):
            raise ChatError(f"/compare needs different values of {SETTING_BY_FIELD[name].label}")
        self.set_alt_mode(session, AltMode("compare", session.alt_mode.k, name, tuple(values)))
