"""EngineClient: the seam the UI, the chat and serve talk to, whichever engine answers.

`chatpage.engine.client.LocalEngineClient` runs the paged engine on a thread of this process;
`chatpage.remote.client.RemoteEngineClient` talks to an OpenAI-compatible server. Both take a
chat as one `ChatRequest` and answer it with `RequestUpdate`s, one per request per engine step,
given to the callback of the submit on the client's own thread: a UI must hand them over to its
own thread without blocking (Textual: ``post_message``). The last update of a request has
``finished`` set; a cancel ends with FinishReason.ABORT, a failure with FinishReason.ERROR and
``error``. How the client itself is doing comes as `EngineStatus`es (a kind and its text), to the
callback given at start. `ServingClient` is what serve needs more of the local client.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from chatpage.engine.outputs import EngineStats, RequestUpdate
from chatpage.engine.sampling_params import SamplingParams, Structured
from chatpage.engine.text.chat_template import ReplyIds as ReplyIds
from chatpage.engine.text.chat_template import TokenCounter as TokenCounter

UpdateCallback = Callable[[RequestUpdate], None]
"""Called with each update of a request, on the client's thread."""

StatsT = TypeVar("StatsT", covariant=True)


class StatusKind(enum.StrEnum):
    """What a status line is, so that its reader never parses the text for it."""

    PROGRESS = "progress"
    """A step of loading or connecting (also a lost server being retried)."""
    READY = "ready"
    """The client can serve (again)."""
    WARNING = "warning"
    """Something went wrong that the client survived (e.g. CUDA graphs turned off)."""
    ERROR = "error"
    """The model did not load, the server refused, the engine failed, a pin failed."""


@dataclass(frozen=True)
class EngineStatus:
    """One status line of a client, typed: ``str()`` gives the line as shown (a warning's or
    an error's text after its kind)."""

    kind: StatusKind
    text: str

    def __str__(self) -> str:
        if self.kind in (StatusKind.WARNING, StatusKind.ERROR):
            return f"{self.kind}: {self.text}"
        return self.text


READY = EngineStatus(StatusKind.READY, "ready")
STARTING = EngineStatus(StatusKind.PROGRESS, "starting")

StatusCallback = Callable[[EngineStatus], None]
"""Called with each status of a client, on the client's thread."""


@dataclass(frozen=True)
class ChatRequest:
    """A chat reply to ask any client for (`EngineClient.submit`).

    ``messages``: the chat so far, OpenAI's shape (assistant ``tool_calls`` and ``tool`` results
    included). ``continue_reply``: the last message is a reply to go on with (updates carry only
    the new text and tokens). ``reply_ids``: the token ids this model produced for some of the
    replies in ``messages`` (by index), sent as they are where the template writes the reply
    verbatim, so the prefix cache serves them (a client that renders no prompt of its own
    ignores them). ``tools``: OpenAI's function tools the reply may call (offered the model's
    way; its calls come as `OutputDelta.tool_calls`, not in its text). ``tool_choice``: ``auto``
    (the model chooses), ``required`` or a tool's name (the reply is a call of them: locally a
    grammar in the model's own format, so even a small model makes a valid one; a server is
    asked to constrain it). ``thinking``: True or False sets the template's `thinking_switch`
    (None: the template's default). ``add_special_tokens``: the rendered prompt also gets the
    special tokens the tokenizer puts around a text (vLLM's flag; only where the client renders
    the prompt itself). ``draft_texts``: text the reply may repeat, which speculative decoding
    drafts from (the other versions of the turn: the reply a regenerate or an edit replaces;
    a client without it ignores them)."""

    messages: list[dict[str, Any]]
    params: SamplingParams
    continue_reply: bool = False
    reply_ids: ReplyIds | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str = "auto"
    thinking: bool | None = None
    add_special_tokens: bool = False
    draft_texts: tuple[str, ...] = ()


class EngineClient(Protocol[StatsT]):
    """What every client offers; ``StatsT`` is the snapshot its `stats` gives the gauge."""

    error: str | None
    """Why the engine cannot serve (the model did not load, the server refused), else None."""
    status: EngineStatus
    """The latest status (`STARTING` at first, `READY` once it can serve)."""
    model: str | None
    """The model asked for (a path or a served model id; None: the default)."""
    model_name: str
    max_model_len: int
    warnings: list[str]
    """What the load found wrong but survived (shown once the client is ready)."""
    thinking_switch: str | None
    """The chat template's variable that turns thinking on or off (``enable_thinking``), None
    when it has none (or, over a server, it cannot be known)."""
    counter: TokenCounter | None
    """Exact prompt sizes with the model's tokenizer (None: not ready, or a server's model)."""

    def start(self, on_status: StatusCallback | None = None) -> None:
        """Load or connect on the client's thread; ``on_status`` gets each status."""
        ...

    @property
    def ready(self) -> bool: ...

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until ready or failed (or ``timeout``); returns `ready`."""
        ...

    def close(self) -> None: ...

    def submit(self, request: ChatRequest, on_update: UpdateCallback) -> str:
        """Queue a chat reply (before ready too); returns its request id. A client refuses
        (ValueError) what it cannot do: ``thinking`` without a `thinking_switch`, say."""
        ...

    def submit_prompt(
        self, prompt: str | list[int], params: SamplingParams, on_update: UpdateCallback
    ) -> str:
        """Queue a completion of a raw ``prompt`` (text, or token ids), no chat template."""
        ...

    def cancel(self, request_id: str) -> None:
        """Stop a request: its last update ends every output with FinishReason.ABORT."""
        ...

    def pin_system_prompt(
        self, system_prompt: str, tools: list[dict[str, Any]] | None = None
    ) -> None:
        """Keep a persona's system prompt, with the ``tools`` its chats offer, ready for every
        chat to share (a pinned prefix locally, a warmed prefix cache on a server)."""
        ...

    def stats(self) -> StatsT | None:
        """The latest snapshot for the gauge; None before the first."""
        ...


class ServingClient(EngineClient[EngineStats], Protocol):
    """A client whose model runs in this process (`LocalEngineClient`): what `chatpage serve`
    needs beyond `EngineClient` to read API requests the model's way, asked only once ready."""

    vocab_size: int
    """The model's vocabulary size (the bound of a request's token ids and logit biases)."""

    def submit_prompt(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        on_update: UpdateCallback,
        add_special_tokens: bool = True,
    ) -> str:
        """`EngineClient.submit_prompt`; ``add_special_tokens`` False: a text prompt's ids
        without those the tokenizer puts around a text (vLLM's flag)."""
        ...

    def token_text(self, token_id: int) -> str:
        """One token's text (a logprob's ``token``)."""
        ...

    def tool_grammar(self, tools: list[dict[str, Any]], parallel: bool) -> str:
        """The grammar of a reply that calls some of ``tools`` (one call, or with ``parallel``
        any number) in the model's own format, its special tokens by id."""
        ...

    def compile_grammar(self, spec: Structured) -> Future[Any]:
        """``spec`` compiled, or being compiled off this thread: the future fails with
        ValueError when it does not compile (a submit of it waits for it otherwise)."""
        ...
