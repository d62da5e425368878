"""PersonaActions: a chat's system prompt and persona, changed from the app (one part of
`ChatScreen`, kept apart for size).

A chat's system prompt is the start of every prompt it sends. A prompt used by several open
chats is pinned in the engine (prefilled once, its blocks shared and never evicted); persona
prompts are pinned at start. "Save as persona" writes the chat's persona, as edited, to the
user's personas folder (`chatpage.config.personas.save_persona`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from textual import work

from chatpage.chat.chats import Chats
from chatpage.chat.session import ChatSession, SamplingSettings, SettingsChanged
from chatpage.config.personas import Persona, save_persona
from chatpage.ui.history import SavedChats
from chatpage.ui.screens.persona_editor import PersonaEditor
from chatpage.ui.screens.persona_picker import PersonaPicker
from chatpage.ui.screens.system_prompt import SystemPromptEditor

if TYPE_CHECKING:
    from textual.app import App


class PersonaActions:
    """Persona and system-prompt actions of `ChatScreen`; it provides the attributes below."""

    chats: Chats
    saved: SavedChats
    personas: list[Persona]
    current: ChatSession | None
    pinned: set[str]
    reload_personas: Callable[[], None]
    say: Callable[..., None]
    app: App

    def pin(self, system_prompt: str) -> None:
        """Pin ``system_prompt`` in the engine (once)."""
        if system_prompt not in self.pinned:
            self.pinned.add(system_prompt)
            self.chats.client.pin_system_prompt(system_prompt)

    def set_system_prompt(self, session: ChatSession, text: str) -> None:
        """Give ``session`` its own system prompt (its persona otherwise unchanged)."""
        text = text.strip()
        if not text:
            raise ValueError("give the new system prompt: /system TEXT (or /system alone to "
                             "edit it)")
        session.persona = replace(session.persona, system_prompt=text)
        session.changed(SettingsChanged())
        self.saved.save_system_prompt(session)
        sharing = sum(s.persona.system_prompt == text for s in self.chats.sessions)
        if sharing > 1:
            self.pin(text)
        shared = f"; shared with {sharing - 1} other chat(s), pinned" if sharing > 1 else ""
        self.say(f"this chat's system prompt is set ({len(text):,} characters){shared}")

    @work(exclusive=True, group="dialog")
    async def edit_system_prompt(self) -> None:
        """The system prompt editor for the current chat."""
        session = self.current
        if session is None:
            return
        text = await self.app.push_screen_wait(SystemPromptEditor(
            session.persona.system_prompt, f"System prompt of {session.title!r}"))
        if text is not None and session in self.chats.sessions:
            self.set_system_prompt(session, text)

    def switch_persona(self, session: ChatSession, persona: Persona) -> None:
        """Continue ``session`` with ``persona``: its system prompt and sampling defaults."""
        session.persona = persona
        self.chats.set_sampling(session, SamplingSettings.for_persona(persona))
        self.saved.save_persona(session)
        self.pin(persona.system_prompt)
        self.say(f"this chat continues as {persona.name!r}")

    @work(exclusive=True, group="dialog")
    async def action_switch_persona(self) -> None:
        session = self.current
        if session is None:
            return
        picker = PersonaPicker(self.personas, session.persona,
                               title="Switch this chat's persona")
        persona = await self.app.push_screen_wait(picker)
        if persona is not None and session in self.chats.sessions:
            self.switch_persona(session, persona)

    @work(exclusive=True, group="dialog")
    async def action_save_as_persona(self, name: str = "") -> None:
        """The persona editor, filled from the current chat (its system prompt and sampling
        settings); saving writes the persona file and the chat continues as that persona."""
        session = self.current
        if session is None:
            return
        s = session.sampling
        start = replace(session.persona, name=name or f"{session.persona.name}-mine",
                        temperature=s.temperature, top_p=s.top_p, top_k=s.top_k or None,
                        max_tokens=s.max_tokens, seed=s.seed)
        edited = await self.app.push_screen_wait(PersonaEditor(start, "Save as persona"))
        if edited is None:
            return
        try:
            saved = save_persona(edited)
        except ValueError as err:
            self.say(str(err), "error")
            return
        self.reload_personas()
        self.say(f"saved the persona {saved.name!r} to {saved.source}")
        if session in self.chats.sessions:
            self.switch_persona(session, saved)
