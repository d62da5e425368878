"""One message of a chat and the versions of its turn: the tree's node types.

An `Entry` is a message with what it carries (attachments, a reply's stats, thinking and tool
calls); it follows its `parent`, and the versions of the turn after it are a `Fork`. The tree
(`chatpage.chat.tree`) and the session (`chatpage.chat.session`) both build on these, so they
live below both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from chatpage.chat.conversation import Message
from chatpage.vocab import MessageStatus

EntryStatus = MessageStatus
"""The same vocabulary as the store's message status (plain strings compare equal)."""


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
    disk_tokens: int = field(default=0, compare=False)  # of prefix_hit_tokens, those read
    # from the KV disk tier (shown, not saved)
    elapsed_s: float = 0.0
    prefilled_tokens: int = field(default=0, compare=False)  # of prompt_tokens, while the
    # prompt prefills (shown, not saved)
    draft_tokens: int = field(default=0, compare=False)  # speculative decoding's drafts, and
    accepted_tokens: int = field(default=0, compare=False)  # those kept (shown, not saved)

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

    def line(self) -> str:
        """``24 tokens · 31.5 tok/s · first token 0.21 s · cache 16/40 prompt tokens``
        (``, 16 from disk`` where the KV disk tier gave them; `` · drafts 12/20 accepted`` with
        speculative decoding's drafts); while a long prompt prefills, ``reading the prompt:
        2,048 / 6,000 tokens``. The app's stats line under a reply, and `ask --stats`."""
        if self.prefilling:
            return f"reading the prompt: {self.prefilled_tokens:,} / {self.prompt_tokens:,} tokens"
        parts = [f"{self.tokens} token{'s' if self.tokens != 1 else ''}"]
        if self.tokens_per_s:
            parts.append(f"{self.tokens_per_s:.1f} tok/s")
        if self.ttft_s is not None:
            parts.append(f"first token {self.ttft_s:.2f} s")
        if self.prompt_tokens:
            disk = f", {self.disk_tokens} from disk" if self.disk_tokens else ""
            parts.append(f"cache {self.prefix_hit_tokens}/{self.prompt_tokens} prompt tokens{disk}")
        if self.draft_tokens:
            parts.append(f"drafts {self.accepted_tokens}/{self.draft_tokens} accepted")
        return " · ".join(parts)

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
class Fork:
    """The versions of one turn (oldest first) and which of them is current (-1: none is
    on show, while alternatives for the turn are being chosen)."""

    versions: list[Entry] = field(default_factory=list)
    current: int = 0

    def chosen(self) -> Entry | None:
        return self.versions[self.current] if self.versions and self.current >= 0 else None

    def index(self, entry: Entry) -> int:
        """Where `entry` itself is among the versions (by identity: two versions with the
        same text are still two versions)."""
        for i, version in enumerate(self.versions):
            if version is entry:
                return i
        raise ValueError("the message is not a version of this turn")

    def place(self, entry: Entry) -> Place:
        """Where `entry` stands among the versions."""
        return Place(self.index(entry) + 1, len(self.versions))


@dataclass(frozen=True)
class Place:
    """Where a message stands among its versions: `number` of `count` (1-based), what the
    transcript shows as ``◀ 2/3 ▶`` when count > 1."""

    number: int
    count: int

    @property
    def forked(self) -> bool:
        return self.count > 1

    def label(self) -> str:
        return f"◀ {self.number}/{self.count} ▶"


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
