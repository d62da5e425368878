"""The state of one chat, kept apart from the widgets that show it.

A `ChatSession` is plain data plus an observer hook: everything that changes it calls
`ChatSession.changed`, and every observer (the session's views, the recorder) is told what
changed through a `Change` (`chatpage.chat.changes`). Its messages are `Entry` nodes
(`chatpage.chat.entry`) in a `Transcript` (`chatpage.chat.tree`). Nothing here imports
Textual or touches the engine. A session and its entries carry their ids in the store
(`store_id`) once saved.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from chatpage.chat.changes import Change
from chatpage.chat.conversation import Conversation
from chatpage.chat.entry import Attachment, Entry, ReplyStats, ToolRun
from chatpage.chat.mcp import McpTool
from chatpage.chat.sampling import AltMode, SamplingSettings
from chatpage.chat.tree import Transcript
from chatpage.config.personas import Persona
from chatpage.vocab import FinishReason

GenerationKind = Literal["reply", "samples", "beam", "compare"]

MIN_ALTERNATIVES, MAX_ALTERNATIVES = 2, 6
"""How many alternatives (samples, beams, compared settings) one reply may offer."""


@dataclass(frozen=True)
class Deletion:
    """A message deleted (with what followed it) and where it stood, for undo: its place
    among the versions of its turn, and whether it was the one on show."""

    entry: Entry
    index: int
    shown: bool


@dataclass
class Candidate:
    """One pane of alternatives: a sample, a beam, or one setting of a comparison."""

    label: str
    request_id: str
    index: int
    text: str = ""
    cumulative_logprob: float = 0.0
    score: float | None = None
    finish_reason: FinishReason | None = None
    error: str | None = None
    stats: ReplyStats = field(default_factory=ReplyStats)
    token_ids: tuple[int, ...] | None = None
    reasoning: str = ""
    reasoning_tokens: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def still_thinking(self) -> bool:
        """It streams and has written only thinking so far."""
        return not self.finished and not self.text


@dataclass
class Generation:
    """What a session is waiting for: one reply, or alternatives (until one is kept)."""

    kind: GenerationKind
    request_ids: list[str]
    entry: Entry | None = None  # the reply being written ("reply" only)
    parent: Entry | None = None  # the message being answered (None: a reply at the top)
    continued: ReplyStats | None = None  # /continue: the reply's stats before it went on
    base_text: str = ""  # /continue: the reply's text before it went on
    base_reasoning: str = ""  # /continue: the reply's thinking before it went on
    base_ids: tuple[int, ...] | None = None  # /continue: the reply's token ids before it went on
    candidates: list[Candidate] = field(default_factory=list)
    finished_requests: set[str] = field(default_factory=set)
    tools: list[McpTool] = field(default_factory=list)  # offered to the model this turn
    tool_choice: str = "auto"  # of the next round: auto, none, required or a tool's name
    tools_busy: bool = False  # servers starting, or calls asked for or running

    @property
    def streaming(self) -> bool:
        return self.tools_busy or len(self.finished_requests) < len(self.request_ids)

    @property
    def alternatives(self) -> bool:
        return self.kind != "reply"


Observer = Callable[["ChatSession", Change], None]


@dataclass(eq=False)
class ChatSession:
    """One chat: persona, transcript, settings, and the generation in flight."""

    id: int
    persona: Persona
    title: str = "New chat"
    transcript: Transcript = field(default_factory=Transcript)
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    alt_mode: AltMode = field(default_factory=AltMode)
    generation: Generation | None = None
    attachments: list[Attachment] = field(default_factory=list)  # for the next message
    history: list[str] = field(default_factory=list)  # prompts typed, oldest first
    draft: str = ""
    editing: Entry | None = None  # a message of the user's being rewritten (the next send forks)
    deleted: list[Deletion] = field(default_factory=list)  # what undo brings back, last first
    thinking: bool | None = None  # /think on|off (None: as the model's chat template has it)
    speculate: bool = True  # /spec on|off: replies drafted and verified (the persona's at first)
    context_tokens: int = 0  # the model's window (0 until it is known)
    prompt_tokens: int = 0  # what the prompt of the latest turn sent takes (its fit's count)
    store_id: int | None = None  # the saved chat, once it has a message
    always_tools: dict[tuple[str, str], McpTool] = field(default_factory=dict)
    """The tools the user allowed for good, by (server, tool), as each was when allowed
    (`chatpage.chat.tool_turns.always_allowed`)."""
    observers: list[Observer] = field(default_factory=list, repr=False)

    @classmethod
    def new(cls, session_id: int, persona: Persona) -> ChatSession:
        return cls(
            session_id,
            persona,
            sampling=SamplingSettings.for_persona(persona),
            speculate=persona.speculate,
        )

    # -- the hook point ------------------------------------------------------------------------
    def changed(self, change: Change) -> None:
        """Tell every observer about `change`."""
        for observer in list(self.observers):
            observer(self, change)

    # -- derived state -------------------------------------------------------------------------
    @property
    def streaming(self) -> bool:
        return self.generation is not None and self.generation.streaming

    @property
    def choosing(self) -> bool:
        """Alternatives are shown and none has been kept yet."""
        return self.generation is not None and self.generation.alternatives

    @property
    def tool_questions(self) -> list[ToolRun]:
        """The tool calls of the reply being written that wait for the user's answer."""
        gen = self.generation
        if gen is None or gen.entry is None or not gen.entry.steps:
            return []
        return [run for run in gen.entry.steps[-1].runs if run.state == "asking"]

    @property
    def entries(self) -> list[Entry]:
        """The messages on show: the current version at every fork, from the top down."""
        return self.transcript.path()

    def sent(self, upto: Entry | None = None) -> list[Entry]:
        """The messages the model sees: those on show (up to and including `upto`), less
        failed replies and turns dropped to fit the context."""
        return [e for e in self.transcript.path(upto) if e.in_context and not e.dropped]

    def conversation(self, upto: Entry | None = None) -> Conversation:
        """What the model sees: the system prompt and the `sent` messages (a reply's tool
        rounds as the assistant's calls and the ``tool`` results)."""
        return Conversation(
            self.persona.system_prompt,
            [m for e in self.sent(upto) for m in e.model_messages()],
        )

    def for_model(self, upto: Entry | None = None) -> list[dict[str, Any]]:
        return self.conversation(upto).for_model()

    def reply_ids(self, model: str, upto: Entry | None = None) -> dict[int, tuple[int, ...]]:
        """The token ids ``model`` produced for the replies of `for_model` (`upto`), by their
        index there (after the system prompt)."""
        ids, index = {}, 1
        for e in self.sent(upto):
            index += len(e.model_messages())
            if e.token_ids is not None and e.token_source == model and not e.steps:
                ids[index - 1] = e.token_ids
        return ids

    def last(self, role: str) -> Entry | None:
        return next((e for e in reversed(self.entries) if e.role == role), None)

    @property
    def used_tokens(self) -> int:
        """What the latest reply on show took of the context: its prompt and its tokens; while
        one streams, its prompt (as counted before it was sent, until the engine says) and the
        tokens so far."""
        gen = self.generation
        if (
            gen is not None
            and gen.streaming
            and gen.entry is not None
            and gen.entry.stats is not None
        ):
            streaming = gen.entry.stats
            before = gen.continued.tokens if gen.continued is not None else 0
            return (streaming.prompt_tokens or self.prompt_tokens) + streaming.tokens - before
        stats = self.last_stats()
        return 0 if stats is None else stats.prompt_tokens + stats.tokens

    def last_stats(self) -> ReplyStats | None:
        for entry in reversed(self.entries):
            if entry.stats is not None and entry.stats.prompt_tokens:
                return entry.stats
        return None
