"""The state of one chat, kept apart from the widgets that show it.

A `ChatSession` is plain data plus an observer hook: everything that changes it calls
`ChatSession.changed`, and every observer (the session's view today, persistence later) is told
what changed through a `Change`. Nothing here imports Textual or touches the engine. A session and
its entries carry their ids in the store (`store_id`) once saved.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Literal

from chatpage.chat.conversation import Conversation, Message
from chatpage.config.personas import Persona
from chatpage.engine.sampling_params import SamplingParams

EntryStatus = Literal["done", "streaming", "stopped", "interrupted", "error"]
"""The same vocabulary as the store's message status."""

GenerationKind = Literal["reply", "samples", "beam", "compare"]
ChangeKind = Literal[
    "entry_added",  # Change.entry was appended
    "entry_updated",  # Change.entry's text, status or stats changed
    "entries_reset",  # entries were removed or replaced: redraw them all
    "generation",  # alternatives started, were kept or dropped
    "candidate_updated",  # Change.index of the alternatives changed
    "settings",  # sampling settings or the next-reply mode
    "title",
    "attachments",
    "busy",  # streaming started or ended
    "closed",  # the session was closed (its generation stopped); it is no longer open
]

MIN_ALTERNATIVES, MAX_ALTERNATIVES = 2, 6


@dataclass(frozen=True)
class Change:
    kind: ChangeKind
    entry: Entry | None = None
    index: int | None = None


# -- sampling ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SettingInfo:
    field: str
    label: str  # how the UI names it (slash command, settings screen)
    kind: type
    allowed: str


SETTINGS: tuple[SettingInfo, ...] = (
    SettingInfo("temperature", "temperature", float, "a number >= 0 (0 = greedy)"),
    SettingInfo("top_p", "top-p", float, "a number > 0 and <= 1"),
    SettingInfo("top_k", "top-k", int, "a whole number >= 0 (0 = off)"),
    SettingInfo("max_tokens", "max tokens", int, "a whole number >= 1"),
    SettingInfo("seed", "seed", int, "a whole number, or 'off' for a random seed"),
)
SETTING_BY_FIELD = {info.field: info for info in SETTINGS}


@dataclass(frozen=True)
class SamplingSettings:
    """A session's decoding settings; they start as the persona's."""

    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 512
    seed: int | None = None

    @classmethod
    def for_persona(cls, persona: Persona) -> SamplingSettings:
        return cls(**persona.sampling())

    def params(self, **overrides: object) -> SamplingParams:
        """SamplingParams for one request (raises ValueError naming a bad field)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(overrides)
        return SamplingParams(**values)  # type: ignore[arg-type]

    def with_value(self, name: str, raw: str | float | int | None) -> SamplingSettings:
        """A copy with ``name`` set from user input; ValueError names the setting and the rule."""
        info = SETTING_BY_FIELD[name]
        value = parse_setting(info, raw)
        updated = replace(self, **{name: value})
        try:
            updated.params()
        except ValueError:
            raise ValueError(f"{info.label} must be {info.allowed}, got {raw!r}") from None
        return updated

    def describe(self) -> str:
        seed = "random" if self.seed is None else str(self.seed)
        top_k = f" · top-k {self.top_k}" if self.top_k else ""
        return (f"temp {self.temperature:g} · top-p {self.top_p:g}{top_k} · "
                f"max {self.max_tokens} · seed {seed}")


def parse_setting(info: SettingInfo, raw: str | float | int | None) -> float | int | None:
    """``raw`` (typed text or a number) as the setting's type; ValueError explains the rule."""
    if isinstance(raw, str):
        text = raw.strip()
        if info.field == "seed" and text.lower() in ("", "off", "none", "random"):
            return None
        try:
            return info.kind(text) if info.kind is float else int(text, 10)
        except ValueError:
            raise ValueError(f"{info.label} must be {info.allowed}, got {text!r}") from None
    if raw is None and info.field == "seed":
        return None
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise ValueError(f"{info.label} must be {info.allowed}, got {raw!r}")
    return raw


@dataclass(frozen=True)
class AltMode:
    """How the next reply is asked for: one reply, n samples, or a beam of width k."""

    kind: Literal["off", "samples", "beam"] = "off"
    k: int = 3

    def describe(self) -> str:
        if self.kind == "samples":
            return f"{self.k} samples"
        if self.kind == "beam":
            return f"beam width {self.k}"
        return "one reply"


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

    @property
    def tokens_per_s(self) -> float:
        """Decode speed: tokens after the first over the time after the first token."""
        if self.ttft_s is None or self.tokens < 2 or self.elapsed_s <= self.ttft_s:
            return 0.0
        return (self.tokens - 1) / (self.elapsed_s - self.ttft_s)

    def as_dict(self) -> dict[str, float | int | None]:
        return {"tokens": self.tokens, "prompt_tokens": self.prompt_tokens,
                "prefix_hit_tokens": self.prefix_hit_tokens, "ttft_s": self.ttft_s,
                "elapsed_s": self.elapsed_s}


@dataclass
class Entry:
    """One message in the transcript."""

    role: Literal["user", "assistant"]
    content: str
    status: EntryStatus = "done"
    attachments: list[Attachment] = field(default_factory=list)
    stats: ReplyStats | None = None
    label: str | None = None  # the alternative this reply was kept from
    error: str | None = None
    store_id: int | None = field(default=None, compare=False, repr=False)

    @property
    def in_context(self) -> bool:
        """Sent to the model on the next turn (failed replies are not)."""
        return self.status != "error"

    def model_content(self) -> str:
        parts = [self.content] if self.content else []
        parts += [a.for_model() for a in self.attachments]
        return "\n\n".join(parts)


@dataclass
class Candidate:
    """One pane of alternatives: a sample, a beam, or one setting of a comparison."""

    label: str
    request_id: str
    index: int
    text: str = ""
    cumulative_logprob: float = 0.0
    score: float | None = None
    finish_reason: str | None = None
    error: str | None = None
    stats: ReplyStats = field(default_factory=ReplyStats)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class Generation:
    """What a session is waiting for: one reply, or alternatives (until one is kept)."""

    kind: GenerationKind
    request_ids: list[str]
    entry: Entry | None = None  # the reply being written ("reply" only)
    candidates: list[Candidate] = field(default_factory=list)
    finished_requests: set[str] = field(default_factory=set)

    @property
    def streaming(self) -> bool:
        return len(self.finished_requests) < len(self.request_ids)

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
    entries: list[Entry] = field(default_factory=list)
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    alt_mode: AltMode = field(default_factory=AltMode)
    generation: Generation | None = None
    attachments: list[Attachment] = field(default_factory=list)  # for the next message
    history: list[str] = field(default_factory=list)  # prompts typed, oldest first
    draft: str = ""
    store_id: int | None = None  # the saved chat, once it has a message
    observers: list[Observer] = field(default_factory=list, repr=False)

    @classmethod
    def new(cls, session_id: int, persona: Persona) -> ChatSession:
        return cls(session_id, persona, sampling=SamplingSettings.for_persona(persona))

    # -- the hook point ------------------------------------------------------------------------
    def changed(self, kind: ChangeKind, entry: Entry | None = None,
                index: int | None = None) -> None:
        change = Change(kind, entry, index)
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

    def conversation(self) -> Conversation:
        return Conversation(self.persona.system_prompt, [
            Message(e.role, e.model_content()) for e in self.entries if e.in_context
        ])

    def for_model(self) -> list[dict[str, str]]:
        return self.conversation().for_model()

    def last(self, role: str) -> Entry | None:
        return next((e for e in reversed(self.entries) if e.role == role), None)

    def last_stats(self) -> ReplyStats | None:
        for entry in reversed(self.entries):
            if entry.stats is not None and entry.stats.prompt_tokens:
                return entry.stats
        return None
