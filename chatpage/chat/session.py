"""The state of one chat, kept apart from the widgets that show it.

A `ChatSession` is plain data plus an observer hook: everything that changes it calls
`ChatSession.changed`, and every observer (the session's views, the recorder) is told what
changed through a `Change`, one frozen dataclass per kind, to `match` on. Nothing here imports
Textual or touches the engine. A session and its entries carry their ids in the store
(`store_id`) once saved.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from chatpage.chat.conversation import Conversation, Message
from chatpage.chat.mcp import McpTool
from chatpage.chat.sampling import AltMode, SamplingSettings
from chatpage.chat.tree import Fork, Place, Transcript
from chatpage.config.personas import Persona
from chatpage.engine.outputs import OutputDelta
from chatpage.vocab import FinishReason, MessageStatus

EntryStatus = MessageStatus
"""The same vocabulary as the store's message status (plain strings compare equal)."""

GenerationKind = Literal["reply", "samples", "beam", "compare"]

MIN_ALTERNATIVES, MAX_ALTERNATIVES = 2, 6
"""How many alternatives (samples, beams, compared settings) one reply may offer."""


# -- changes: what observers are told (one frozen dataclass per kind; dispatch with `match`) -----


@dataclass(frozen=True)
class EntryAdded:
    """`entry` was added to the tree (and is on show, if it is the current version)."""

    entry: Entry


@dataclass(frozen=True)
class EntryUpdated:
    """`entry`'s text, status or stats changed; from the engine, `delta` is the text it brought,
    appended to what is shown (a /continue'd reply too), or replacing it (``rewrite``)."""

    entry: Entry
    delta: OutputDelta | None = None


@dataclass(frozen=True)
class EntryRemoved:
    """`entry` and what followed it left the tree; `shown` is the version its turn shows now,
    as the tree decided (None: no version is left)."""

    entry: Entry
    shown: Entry | None


@dataclass(frozen=True)
class PathChanged:
    """The path on show changed (a fork switched, alternatives offered or put away): redraw it."""


@dataclass(frozen=True)
class EntriesRestored:
    """A deleted `entry` and what followed it came back to the tree, where they were (undo)."""

    entry: Entry


@dataclass(frozen=True)
class Cleared:
    """Every message left the chat (/clear)."""


@dataclass(frozen=True)
class ContextChanged:
    """What the next turn sends changed: the meter, the dropped (greyed) turns."""


@dataclass(frozen=True)
class GenerationChanged:
    """Alternatives started, were kept or were dropped."""


@dataclass(frozen=True)
class CandidateUpdated:
    """Alternative `index` of the generation changed (`delta`: as for `EntryUpdated`)."""

    index: int
    delta: OutputDelta | None = None


@dataclass(frozen=True)
class SettingsChanged:
    """The sampling settings, the next-reply mode or the system prompt changed."""


@dataclass(frozen=True)
class TitleChanged:
    """The chat was renamed."""


@dataclass(frozen=True)
class AttachmentsChanged:
    """The files attached to the next message changed."""


@dataclass(frozen=True)
class BusyChanged:
    """Streaming started or ended."""


@dataclass(frozen=True)
class Closed:
    """The session was closed (its generation stopped); it is no longer open."""


@dataclass(frozen=True)
class ToolAsked:
    """The model wants `run` (a call in `entry`'s latest tool step) run: ask the user
    (`Chats.answer_tool`)."""

    entry: Entry
    run: ToolRun


Change = (
    EntryAdded
    | EntryUpdated
    | EntryRemoved
    | EntriesRestored
    | PathChanged
    | Cleared
    | ContextChanged
    | GenerationChanged
    | CandidateUpdated
    | SettingsChanged
    | TitleChanged
    | AttachmentsChanged
    | BusyChanged
    | Closed
    | ToolAsked
)
"""Every kind of change a session tells its observers about."""


# -- transcript ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attachment:
    """A text file attached to a user message: shown by name, its text sent to the model."""

    name: str
    text: str

    def for_model(self) -> str:
        return f"File `{self.name}`:\n```\n{self.text.rstrip()}\n```"


@dataclass
class ReplyStats:
    """How a reply was produced, from the engine's events."""

    tokens: int = 0
    prompt_tokens: int = 0
    prefix_hit_tokens: int = 0
    ttft_s: float | None = None
    elapsed_s: float = 0.0
    prefilled_tokens: int = field(default=0, compare=False)  # of prompt_tokens, while the
    # prompt prefills (shown, not saved)

    @property
    def prefilling(self) -> bool:
        """The prompt is still being prefilled (no token yet)."""
        return self.tokens == 0 and 0 < self.prefilled_tokens < self.prompt_tokens

    @property
    def tokens_per_s(self) -> float:
        """Decode speed: tokens after the first over the time after the first token."""
        if self.ttft_s is None or self.tokens < 2 or self.elapsed_s <= self.ttft_s:
            return 0.0
        return (self.tokens - 1) / (self.elapsed_s - self.ttft_s)

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "tokens": self.tokens,
            "prompt_tokens": self.prompt_tokens,
            "prefix_hit_tokens": self.prefix_hit_tokens,
            "ttft_s": self.ttft_s,
            "elapsed_s": self.elapsed_s,
        }


ToolState = Literal["asking", "running", "done", "failed", "denied"]
DENIED = "The user did not allow this call; it was not run."


@dataclass(eq=False)
class ToolRun:
    """One tool call of a reply: what the model asked for, and what came of it."""

    id: str
    name: str
    arguments: str  # JSON text
    state: ToolState = "asking"
    result: str = ""  # the tool's answer (failed: why)
    elapsed_s: float = 0.0

    @property
    def resolved(self) -> bool:
        return self.state in ("done", "failed", "denied")

    def for_model(self) -> str:
        """The ``tool`` message the model is given."""
        if self.state == "denied":
            return self.result or DENIED
        return f"Error: {self.result}" if self.state == "failed" else self.result


@dataclass
class ToolStep:
    """What a reply wrote before its calls (``text``), and the calls."""

    text: str
    runs: list[ToolRun] = field(default_factory=list)


@dataclass(eq=False)
class Entry:
    """One message: a node of the chat's tree (`parent`, and the versions of the turn after
    it in `replies`). Entries compare by identity: two messages with the same text ("yes",
    then "yes" again) are two nodes, never one."""

    role: Literal["user", "assistant"]
    content: str
    status: EntryStatus = MessageStatus.DONE
    attachments: list[Attachment] = field(default_factory=list)
    stats: ReplyStats | None = None
    label: str | None = None  # the alternative this reply was kept from
    error: str | None = None
    store_id: int | None = field(default=None, repr=False)
    parent: Entry | None = field(default=None, repr=False)
    fork: Fork | None = field(default=None, repr=False)
    """The versions of this message's turn (it among them), once it is in a transcript."""
    replies: Fork = field(default_factory=Fork, repr=False)
    dropped: bool = False
    """Left out of what the model was last sent, to fit its context (shown greyed)."""
    token_ids: tuple[int, ...] | None = field(default=None, repr=False)
    """A reply's token ids as the model produced them (`token_source` names the model): sent
    back as they are, so the next turn's prompt is what the prefix cache holds."""
    token_source: str | None = field(default=None, repr=False)
    token_count: tuple[str, int, int] | None = field(default=None, repr=False)
    """The exact count of its content: (tokenizer, hash of the text counted, tokens)."""
    reasoning: str = field(default="", repr=False)
    """A reply's thinking (shown folded; never sent back to the model)."""
    reasoning_tokens: int = 0  # the tokens it spent thinking
    steps: list[ToolStep] = field(default_factory=list)
    """A reply's tool calls, in order, each round with the text before it (``content`` is
    what it wrote after the last)."""

    @property
    def still_thinking(self) -> bool:
        """It streams and has written only thinking so far."""
        return self.status == MessageStatus.STREAMING and not self.content

    @property
    def in_context(self) -> bool:
        """Part of the conversation the model sees (failed replies are not)."""
        return self.status != MessageStatus.ERROR

    def place(self) -> Place:
        """Where it stands among the versions of its turn (``◀ 2/3 ▶``); 1/1 when alone."""
        return Place(1, 1) if self.fork is None else self.fork.place(self)

    def model_content(self) -> str:
        parts = [self.content] if self.content else []
        parts += [a.for_model() for a in self.attachments]
        return "\n\n".join(parts)

    def model_messages(self) -> list[Message]:
        """What the model sees of it: a reply's tool rounds (its calls, their results as
        ``tool`` messages) and then its text (none while the next round is awaited)."""
        out = []
        for step in self.steps:
            calls = [
                {
                    "id": r.id,
                    "type": "function",
                    "function": {"name": r.name, "arguments": r.arguments},
                }
                for r in step.runs
            ]
            out.append(Message("assistant", step.text, tool_calls=calls))
            out += [Message("tool", r.for_model(), tool_call_id=r.id) for r in step.runs]
        if self.content or not self.steps:
            out.append(Message(self.role, self.model_content()))
        return out


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
    context_tokens: int = 0  # the model's window (0 until it is known)
    prompt_tokens: int = 0  # what the prompt of the latest turn sent takes (its fit's count)
    store_id: int | None = None  # the saved chat, once it has a message
    always_tools: dict[tuple[str, str], McpTool] = field(default_factory=dict)
    """The tools the user allowed for good, by (server, tool), as each was when allowed
    (`chatpage.chat.tool_turns.always_allowed`)."""
    observers: list[Observer] = field(default_factory=list, repr=False)

    @classmethod
    def new(cls, session_id: int, persona: Persona) -> ChatSession:
        return cls(session_id, persona, sampling=SamplingSettings.for_persona(persona))

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
