"""Handlers of the actions on how the chat on show answers: its sampling settings, its
alternatives, its system prompt and persona.

A chat's system prompt is the start of every prompt it sends; one shared by several open chats
is pinned in the engine (`Chats.pin`). "Save as persona" writes the chat's persona, as edited,
to the user's personas folder (`chatpage.config.personas.save_persona`).
"""

from __future__ import annotations

from dataclasses import replace

from chatpage.chat.commands import parse_compare, parse_k
from chatpage.chat.sampling import SETTING_BY_FIELD, SETTINGS, AltKind, AltMode, SamplingSettings
from chatpage.chat.session import ChatSession
from chatpage.config.personas import Persona, find_persona, save_persona
from chatpage.ui.actions.action import Controls, Handler, on_chat
from chatpage.ui.actions.sessions import persona_named
from chatpage.ui.screens.persona_editor import PersonaEditor
from chatpage.ui.screens.persona_picker import PersonaPicker
from chatpage.ui.screens.sampling_settings import SamplingSettingsScreen
from chatpage.ui.screens.system_prompt import SystemPromptEditor
from chatpage.vocab import UserError


def _setting_value(value: object) -> str:
    return "off" if value is None else str(value)


def setting(name: str, field: str) -> Handler:
    """``/name VALUE`` sets the sampling setting ``field``; ``/name`` alone says its value."""
    info = SETTING_BY_FIELD[field]

    @on_chat
    async def run(c: Controls, session: ChatSession, arg: str | None) -> None:
        if not arg:
            c.say(
                f"{info.label} is {_setting_value(getattr(session.sampling, field))} "
                f"(set it with /{name} VALUE: {info.allowed})"
            )
            return
        c.chats.set_setting(session, field, arg)
        c.say(f"{info.label} set to {_setting_value(getattr(session.sampling, field))}")

    return run


@on_chat
async def think(c: Controls, session: ChatSession, arg: str | None) -> None:
    """``/think on|off``; alone, says how this chat's replies think."""
    if not arg:
        state = {None: "as the chat template has it", True: "on", False: "off"}[session.thinking]
        c.say(f"thinking is {state} in this chat (set it with /think on|off)")
        return
    c.say(c.chats.set_thinking(session, arg))


@on_chat
async def spec(c: Controls, session: ChatSession, arg: str | None) -> None:
    """``/spec on|off``; alone, says whether this chat's replies speculate."""
    if not arg:
        state = "on" if session.speculate else "off"
        c.say(f"speculative decoding is {state} in this chat (set it with /spec on|off)")
        return
    c.say(c.chats.set_speculate(session, arg))


@on_chat
async def sampling_settings(c: Controls, session: ChatSession, arg: str | None) -> None:
    """The settings dialog of the chat on show."""

    async def edit() -> None:
        settings: SamplingSettings | None = await c.ask(
            SamplingSettingsScreen(session.sampling, session.persona)
        )
        if settings is not None and session in c.chats.sessions:
            c.chats.set_sampling(session, settings)

    c.dialog(edit)


def alternatives(kind: AltKind) -> Handler:
    """The next reply as ``kind``: ``/samples K``, ``/beam K`` (K alternatives, 3 when not
    given); from the palette the number stays as it was."""

    @on_chat
    async def run(c: Controls, session: ChatSession, arg: str | None) -> None:
        k = session.alt_mode.k if arg is None or kind == "off" else parse_k(arg, kind)
        c.chats.set_alt_mode(session, AltMode(kind, k))
        if kind != "off" and arg is not None:
            _say_next(c, session)

    return run


@on_chat
async def cycle_alternatives(c: Controls, session: ChatSession, arg: str | None) -> None:
    c.chats.cycle_alt_mode(session)


@on_chat
async def compare(c: Controls, session: ChatSession, arg: str | None) -> None:
    c.chats.compare(session, *parse_compare(arg or ""))
    _say_next(c, session)


def _say_next(c: Controls, session: ChatSession) -> None:
    """What the next reply will be (/samples, /beam, /compare all ask for the next one)."""
    again = " (ctrl+r: your last message again, that way)" if session.last("user") else ""
    c.say(f"next reply: {session.alt_mode.describe()}, side by side{again}")


@on_chat
async def keep(c: Controls, session: ChatSession, arg: str | None) -> None:
    if not arg or not arg.isdigit():
        raise UserError(f"use /keep N with N the pane's number, got {arg or ''!r}")
    c.chats.requests.keep(session, int(arg))


# -- system prompt and persona ------------------------------------------------------------------
def set_system_prompt(c: Controls, session: ChatSession, text: str) -> None:
    """Give ``session`` its own system prompt, keep it, and say so."""
    others = c.chats.set_system_prompt(session, text)
    c.saved.save_system_prompt(session)
    shared = f"; shared with {others} other chat(s), pinned" if others else ""
    c.say(
        f"this chat's system prompt is set "
        f"({len(session.persona.system_prompt):,} characters){shared}"
    )


@on_chat
async def system_prompt(c: Controls, session: ChatSession, arg: str | None) -> None:
    """``/system TEXT`` sets the chat's system prompt; alone, the editor."""
    if arg:
        set_system_prompt(c, session, arg)
        return

    async def edit() -> None:
        text = await c.ask(
            SystemPromptEditor(session.persona.system_prompt, f"System prompt of {session.title!r}")
        )
        if text is not None and session in c.chats.sessions:
            set_system_prompt(c, session, text)

    c.dialog(edit)


def switch_persona_to(c: Controls, session: ChatSession, persona: Persona) -> None:
    """Continue ``session`` as ``persona``, keep it, and say so: with what of the chat's own
    it replaced (its /system prompt, settings set with /max, /temp...)."""
    before, prompt = session.sampling, session.persona.system_prompt
    own = find_persona(c.personas, session.persona.name)
    c.chats.switch_persona(session, persona)
    c.saved.save_persona(session)
    changed = [
        f"{rule.label} {getattr(before, rule.field)} → {getattr(session.sampling, rule.field)}"
        for rule in SETTINGS
        if getattr(before, rule.field) != getattr(session.sampling, rule.field)
    ]
    if (own is None or own.system_prompt != prompt) and prompt != persona.system_prompt:
        changed.insert(0, "its own system prompt → the persona's")
    c.say(
        f"this chat continues as {persona.name!r}" + (f"; {', '.join(changed)}" if changed else ""),
        timeout=12 if changed else None,
    )


@on_chat
async def switch_persona(c: Controls, session: ChatSession, arg: str | None) -> None:
    """``/persona NAME`` continues the chat as that persona; alone, the picker."""
    if arg:
        switch_persona_to(c, session, persona_named(c.personas, arg))
        return

    async def pick() -> None:
        persona = await c.ask(
            PersonaPicker(c.personas, session.persona, title="Switch this chat's persona")
        )
        if persona is not None and session in c.chats.sessions:
            switch_persona_to(c, session, persona)

    c.dialog(pick)


@on_chat
async def save_as_persona(c: Controls, session: ChatSession, arg: str | None) -> None:
    """The persona editor, filled from the chat (its system prompt and sampling settings;
    ``arg``: the name); saving writes the persona file and the chat continues as it."""

    async def edit() -> None:
        s = session.sampling
        start = replace(
            session.persona,
            name=arg or f"{session.persona.name}-mine",
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k or None,
            max_tokens=s.max_tokens,
            seed=s.seed,
        )
        edited = await c.ask(PersonaEditor(start, "Save as persona"))
        if edited is None:
            return
        try:
            saved = save_persona(edited)
        except UserError as err:
            c.say(str(err), "error")
            return
        c.reload_personas()
        c.say(f"saved the persona {saved.name!r} to {saved.source}")
        if session in c.chats.sessions:
            switch_persona_to(c, session, saved)

    c.dialog(edit)
