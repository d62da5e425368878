"""A chat's system prompt and persona, and how its next reply is asked for, changed through
`Chats` (no app): what the session becomes, what is pinned in the engine, what observers hear."""

from __future__ import annotations

import pytest
from helpers import PERSONA, FakeClient

from chatpage.chat.changes import Change, SettingsChanged
from chatpage.chat.chats import ChatError, Chats
from chatpage.chat.sampling import AltMode, SamplingSettings
from chatpage.config.personas import Persona

CODER = Persona("coder", "writes code", "You write code.", temperature=0.2, max_tokens=64, seed=3)


class PinningClient(FakeClient):
    """A FakeClient that also records the system prompts pinned in it."""

    def __init__(self) -> None:
        super().__init__()
        self.pins: list[str] = []

    def pin_system_prompt(self, system_prompt: str, tools=None) -> None:
        self.pins.append(system_prompt)


def test_a_system_prompt_of_its_own_is_pinned_once_another_chat_shares_it():
    client = PinningClient()
    chats = Chats(client, lambda e: None)
    first, second = chats.open(PERSONA), chats.open(PERSONA)
    changes: list[Change] = []
    first.observers.append(lambda s, change: changes.append(change))
    with pytest.raises(ChatError, match="give the new system prompt"):
        chats.set_system_prompt(first, "   ")
    assert first.persona is PERSONA and changes == []

    assert chats.set_system_prompt(first, "  Be terse.\n") == 0  # no other chat has it
    assert (first.persona.name, first.persona.system_prompt) == ("p", "Be terse.")
    assert first.persona.temperature == PERSONA.temperature  # the rest of the persona stays
    assert first.for_model()[0] == {"role": "system", "content": "Be terse."}
    assert changes == [SettingsChanged()] and client.pins == []

    assert chats.set_system_prompt(second, "Be terse.") == 1  # shared: pinned, once
    assert chats.set_system_prompt(first, "Be terse.") == 1
    assert client.pins == ["Be terse."] and chats.pinned == {"Be terse."}


def test_switching_persona_takes_its_prompt_and_sampling_defaults():
    client = PinningClient()
    chats = Chats(client, lambda e: None)
    session = chats.open(PERSONA)
    chats.set_setting(session, "temperature", "1.1")
    chats.set_system_prompt(session, "my own prompt")
    changes: list[Change] = []
    session.observers.append(lambda s, change: changes.append(change))
    chats.switch_persona(session, CODER)
    assert session.persona is CODER
    assert session.sampling == SamplingSettings.for_persona(CODER)
    assert (session.sampling.temperature, session.sampling.seed) == (0.2, 3)
    assert session.for_model()[0] == {"role": "system", "content": "You write code."}
    assert changes == [SettingsChanged()] and client.pins == ["You write code."]
    chats.switch_persona(chats.open(PERSONA), CODER)
    assert client.pins == ["You write code."]  # pinned once for every chat with it


def test_cycling_the_alternatives_keeps_their_number():
    chats = Chats(FakeClient(), lambda e: None)
    session = chats.open(PERSONA)
    chats.set_alt_mode(session, AltMode("off", 5))
    assert [chats.cycle_alt_mode(session) for _ in range(3)] == [
        AltMode("samples", 5),
        AltMode("beam", 5),
        AltMode("off", 5),
    ]
    assert session.alt_mode == AltMode("off", 5)


def test_a_chat_offering_tools_pins_its_system_prompt_with_them_once():
    from helpers import FakeClient

    from chatpage.engine.sampling_params import SamplingParams

    client = FakeClient()
    chats = Chats(client, lambda e: None)
    session = chats.open(PERSONA)
    chats.send(session, "hello")
    tools = [{"type": "function", "function": {"name": "ls", "parameters": {}}}]
    assert client.pinned == []  # (no tools offered yet)
    for _ in range(2):
        chats.requests.submit(session, session.entries[0], SamplingParams(), tools=tools)
    assert client.pinned == [(PERSONA.system_prompt, tools)]
