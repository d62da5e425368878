"""EngineClient: the seam the UI, the chat and serve talk to, whichever engine answers.

`chatpage.engine.client.LocalEngineClient` runs the paged engine on a thread of this process;
`chatpage.remote.client.RemoteEngineClient` talks to an OpenAI-compatible server. Both answer a
request with `RequestUpdate`s, one per request per engine step, given to the callback of the
submit on the client's own thread: a UI must hand them over to its own thread without blocking
(Textual: ``post_message``). The last update of a request has ``finished`` set; a cancel ends with
FinishReason.ABORT, a failure with FinishReason.ERROR and ``error``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from chatpage.engine.outputs import RequestUpdate
from chatpage.engine.sampling_params import SamplingParams
from chatpage.engine.text.chat_template import ReplyIds as ReplyIds
from chatpage.engine.text.chat_template import TokenCounter as TokenCounter

UpdateCallback = Callable[[RequestUpdate], None]
"""Called with each update of a request, on the client's thread."""

StatsT = TypeVar("StatsT", covariant=True)


class EngineClient(Protocol[StatsT]):
    """What every client offers; ``StatsT`` is the snapshot its `stats` gives the gauge."""

    error: str | None
    """Why the engine cannot serve (the model did not load, the server refused), else None."""
    status: str
    """The latest progress line ("starting", "ready", "error: ...")."""
    model: str | None
    """The model asked for (a path or a served model id; None: the default)."""
    model_name: str
    max_model_len: int
    warnings: list[str]
    thinking_switch: str | None
    """The chat template's variable that turns thinking on or off (``enable_thinking``), None
    when it has none (or, over a server, it cannot be known)."""
    counter: TokenCounter | None
    """Exact prompt sizes with the model's tokenizer (None: not ready, or a server's model)."""
    """What the load found wrong but survived (shown once the client is ready)."""

    def start(self, on_status: Callable[[str], None] | None = None) -> None:
        """Load or connect on the client's thread; ``on_status`` gets one-line progress."""
        ...

    @property
    def ready(self) -> bool: ...

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until ready or failed (or ``timeout``); returns `ready`."""
        ...

    def close(self) -> None: ...

    def submit(
        self,
        messages: list[dict[str, str]],
        params: SamplingParams,
        on_update: UpdateCallback,
        *,
        continue_reply: bool = False,
        reply_ids: ReplyIds | None = None,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str = "auto",
        thinking: bool | None = None,
    ) -> str:
        """Queue a chat reply for ``messages`` (before ready too); returns its request id. With
        ``continue_reply`` the last message is a reply to go on with: updates carry only the
        new text and tokens. ``reply_ids``: the token ids this model produced for some of the
        replies in ``messages`` (by index), sent as they are where the template writes the
        reply verbatim, so the prefix cache serves them (a client that renders no prompt of its
        own ignores them). ``tools``: OpenAI's function tools the reply may call (offered the
        model's way; ``messages`` may hold assistant ``tool_calls`` and ``tool`` results): its
        calls come as `OutputDelta.tool_calls`, not in its text. ``tool_choice``: ``auto`` (the
        model chooses), ``required`` or a tool's name (the reply is a call of them: locally a
        grammar in the model's own format, so even a small model makes a valid one; a server
        is asked to constrain it). ``thinking``: True or False sets the template's
        `thinking_switch` (None: the template's default)."""
        ...

    def submit_prompt(
        self, prompt: str | list[int], params: SamplingParams, on_update: UpdateCallback
    ) -> str:
        """Queue a completion of a raw ``prompt`` (text, or token ids), no chat template."""
        ...

    def cancel(self, request_id: str) -> None:
        """Stop a request: its last update ends every output with FinishReason.ABORT."""
        ...

    def pin_system_prompt(self, system_prompt: str) -> None:
        """Keep a persona's system prompt ready for every chat to share (a pinned prefix
        locally, a warmed prefix cache on a server)."""
        ...

    def stats(self) -> StatsT | None:
        """The latest snapshot for the gauge; None before the first."""
        ...
