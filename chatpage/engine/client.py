"""LocalEngineClient: the paged engine on a thread of this process, behind `EngineClient`.

The engine runs on its own thread: it loads the model, then steps whenever there is work.
Everything here is callable from any thread and never waits on a step. Requests are
`ChatRequest`s (or raw prompts); each engine step's `RequestUpdate` for a request goes to the
callback given at submit, called on the engine thread (`chatpage.engine.protocol` says how to
take it). The threads hand each other typed commands (`Command`), never tuples.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from chatpage.config.errorlog import log_error
from chatpage.engine.config import EngineConfig
from chatpage.engine.outputs import (
    EngineStats,
    OutputDelta,
    RequestUpdate,
    ToolCall,
    ToolCallDelta,
    Usage,
    final_update,
)
from chatpage.engine.protocol import (
    READY,
    STARTING,
    ChatRequest,
    EngineClient,
    EngineStatus,
    StatusCallback,
    StatusKind,
    UpdateCallback,
)
from chatpage.engine.sampling_params import GrammarKind, SamplingParams, Structured
from chatpage.engine.text.chat_template import (
    ReplyIds,
    TokenCounter,
    continue_prompt,
    render_prompt,
    with_special_tokens,
)
from chatpage.engine.text.grammar import COMPILE_TIMEOUT_S, too_slow
from chatpage.engine.text.reasoning import thinking_switch
from chatpage.engine.text.tool_calls import forced_tools, tool_format
from chatpage.vocab import FinishReason

if TYPE_CHECKING:  # torch and the model code load on the engine thread (see _run), so that
    from chatpage.engine.llm_engine import LLMEngine  # the app paints before they are imported
    from chatpage.engine.text.tokenizer import TextTokenizer

Render = Callable[["TextTokenizer", list[dict[str, Any]]], list[int]]
"""How chat messages become a prompt's token ids (`render_prompt`, `continue_prompt`)."""

__all__ = [
    "ChatRequest",
    "EngineClient",
    "EngineConfig",
    "EngineStats",
    "EngineStatus",
    "FinishReason",
    "LocalEngineClient",
    "OutputDelta",
    "RequestUpdate",
    "SamplingParams",
    "StatusKind",
    "ToolCall",
    "ToolCallDelta",
    "UpdateCallback",
    "Usage",
]
"""The engine's whole surface for the UI (ui/ imports the engine only through this module)."""


PARKED_POLL_S = 0.1
"""How often an idle engine thread looks at the requests waiting for their grammar's compile."""
CHARS_PER_TOKEN = 32
"""More characters than any one token of a usual vocabulary spells: a prompt of more than this
many times the context window's tokens cannot fit, and is refused before it is tokenized."""


@dataclass(frozen=True)
class Command:
    """What crosses the client's threads, one frozen dataclass per kind (read with ``match``):
    callers -> the tokenizer thread (`ToTokenizer`), the tokenizer thread -> the engine thread
    (`ToEngine`, prompts as token ids); `Wake` ends a thread's wait at close."""

    kind: ClassVar[str]
    """The command's name in an error line."""


@dataclass(frozen=True)
class Request(Command):
    """What every request's command carries: its id, and who is told, since when."""

    rid: str
    params: SamplingParams
    on_update: UpdateCallback
    t0: float


@dataclass(frozen=True)
class SubmitChat(Request):
    """A chat reply as asked for: the messages, how to ``render`` them, the ``tools`` offered
    (the reply is read for calls); ``add_special_tokens``: the rendered ids get those the
    tokenizer puts around a text; ``draft_texts``: what speculative decoding drafts from
    (`ChatRequest.draft_texts`)."""

    kind: ClassVar[str] = "submit"
    messages: list[dict[str, Any]]
    render: Render
    tools: list[dict[str, Any]] | None
    add_special_tokens: bool
    draft_texts: tuple[str, ...] = ()


@dataclass(frozen=True)
class SubmitPrompt(Request):
    """A completion of a raw prompt (text, or token ids), as asked for."""

    kind: ClassVar[str] = "submit"
    prompt: str | list[int]
    add_special_tokens: bool


@dataclass(frozen=True)
class Tokenized(Request):
    """A request as the engine takes it: the prompt's ids, whether it is a chat reply, and
    whether its answer is read for tool calls."""

    kind: ClassVar[str] = "submit"
    ids: list[int]
    chat: bool
    tool_calls: bool


@dataclass(frozen=True)
class Cancel(Command):
    """Stop a request (queued after its submit: it never overtakes it)."""

    kind: ClassVar[str] = "cancel"
    rid: str


@dataclass(frozen=True)
class Pin(Command):
    """Prefill a persona's system prompt and pin it (`LocalEngineClient.pin_system_prompt`)."""

    kind: ClassVar[str] = "pin"
    system_prompt: str
    tools: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class PinIds(Command):
    """A persona's system prompt as the prefix ids every chat with it starts with."""

    kind: ClassVar[str] = "pin"
    ids: list[int]


@dataclass(frozen=True)
class Failed(Command):
    """A command the tokenizer thread could not prepare, and why."""

    kind: ClassVar[str] = "failed"
    command: SubmitChat | SubmitPrompt | Pin
    why: str


@dataclass(frozen=True)
class Wake(Command):
    """Nothing to do: a blocked ``get`` returns, and the thread sees it is stopping."""

    kind: ClassVar[str] = "wake"


ToTokenizer = SubmitChat | SubmitPrompt | Cancel | Pin | Wake
"""What callers queue for the tokenizer thread."""
ToEngine = Tokenized | Cancel | PinIds | Failed | Wake
"""What the tokenizer thread (and a failed callback) queues for the engine thread."""


def _render_chat(
    template: Callable[..., list[int]],
    reply_ids: ReplyIds | None,
    tools: list[dict[str, Any]] | None,
    variables: dict[str, Any],
    tokenizer: TextTokenizer,
    messages: list[dict[str, Any]],
) -> list[int]:
    """A chat's prompt ids through ``template`` (`render_prompt`, `continue_prompt`), with
    ``tools`` offered the model's way (`tool_format`: the template's ``tools`` variable, or a
    listing in the system prompt) and the template's ``variables``."""
    if tools:
        fmt = tool_format(getattr(tokenizer, "chat_template", None))
        shown = fmt.prompt_messages(messages, tools)
        shift = len(shown) - len(messages)  # (a system message put first for the listing)
        messages = shown
        reply_ids = {i + shift: ids for i, ids in (reply_ids or {}).items()}
        tools = tools if fmt.renders_tools else None
    return template(tokenizer, messages, reply_ids=reply_ids, tools=tools, variables=variables)


def chat_ids(
    tokenizer: TextTokenizer,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
) -> list[int]:
    """A chat's prompt ids with ``tools`` offered the model's way (`_render_chat`)."""

    def template(tok: Any, shown: list[dict[str, Any]], **kw: Any) -> list[int]:
        return render_prompt(tok, shown, add_generation_prompt, **kw)

    return _render_chat(template, None, tools, {}, tokenizer, messages)


def persona_prefix(
    tokenizer: TextTokenizer, system_prompt: str, tools: list[dict[str, Any]] | None = None
) -> list[int]:
    """The ids every chat of a persona (its ``system_prompt``, offering ``tools``) starts with,
    the tools shown as its chats show them (the template's way, or a listing in the system
    prompt where the template renders none): what a pin holds."""
    return chat_ids(tokenizer, [{"role": "system", "content": system_prompt}], tools, False)


def prompt_chars(
    prompt: str | list[int] | list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
) -> int:
    """The characters of the text a prompt renders: a text's own; each message's content and
    its tool calls' names and arguments; the ``tools`` offered (names, descriptions and
    schemas, as JSON); none for token ids."""
    if isinstance(prompt, str):
        return len(prompt)
    chars = len(json.dumps(tools, ensure_ascii=False, default=str)) if tools else 0
    for message in prompt:
        if not isinstance(message, dict):
            continue
        chars += len(message.get("content") or "")
        for call in message.get("tool_calls") or ():
            function = call.get("function") or {}
            arguments = function.get("arguments") or ""
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments, ensure_ascii=False, default=str)
            chars += len(function.get("name") or "") + len(arguments)
    return chars


class LocalEngineClient:
    """Owns an engine thread; submit / cancel / stats from anywhere."""

    def __init__(self, model: str | None = None, config: EngineConfig | None = None) -> None:
        self.model = model
        self.config = config or EngineConfig()
        self._commands: queue.SimpleQueue[ToTokenizer] = queue.SimpleQueue()  # callers ->
        self._work: queue.SimpleQueue[ToEngine] = queue.SimpleQueue()  # tokenized -> engine
        self._thread: threading.Thread | None = None
        self._tokenizer_thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stopping = False
        self._stats: EngineStats | None = None
        self._callbacks: dict[str, tuple[UpdateCallback, float]] = {}
        # submits whose grammar is still compiling (on a grammar thread): command, since when
        self._parked: dict[str, tuple[Tokenized, float]] = {}
        self._next_id = 0
        self._id_lock = threading.Lock()
        self.engine: LLMEngine | None = None
        self.error: str | None = None
        self.status = STARTING
        self.model_name = "model"
        self.max_model_len = 0
        self.vocab_size = 0
        self.warnings: list[str] = []
        self.counter: TokenCounter | None = None
        self.thinking_switch: str | None = None
        self.load_seconds: float | None = None

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self, on_status: StatusCallback | None = None) -> None:
        """Load the model on the engine thread; ``on_status`` gets each status."""
        self._on_status = on_status or (lambda _status: None)
        self._thread = threading.Thread(target=self._run, name="chatpage-engine", daemon=True)
        self._thread.start()

    @property
    def ready(self) -> bool:
        return self._ready.is_set() and self.engine is not None

    def wait_ready(self, timeout: float | None = None) -> bool:
        self._ready.wait(timeout)
        return self.ready

    def close(self) -> None:
        self._stopping = True
        self._commands.put(Wake())
        self._work.put(Wake())
        for thread in (self._thread, self._tokenizer_thread):
            if thread is not None:
                thread.join(timeout=5)

    # -- requests (see `EngineClient`) ---------------------------------------------------------------
    def submit(self, request: ChatRequest, on_update: UpdateCallback) -> str:
        template = continue_prompt if request.continue_reply else render_prompt
        params, tools = request.params, request.tools
        forced = forced_tools(tools or [], request.tool_choice)
        if forced and self.engine is not None:  # (before the load: no grammar, as it was)
            grammar = self.tool_grammar(forced, True)
            params = dataclasses.replace(
                params, structured=Structured(GrammarKind.GRAMMAR, grammar)
            )
        switch = self.thinking_switch if request.thinking is not None else None
        if request.thinking is not None and switch is None:
            raise ValueError("this model's chat template has no thinking switch")
        variables = {switch: request.thinking} if switch is not None else {}
        render = functools.partial(_render_chat, template, request.reply_ids, tools, variables)
        rid = self._new_id()
        self._commands.put(
            SubmitChat(
                rid,
                params,
                on_update,
                time.monotonic(),
                request.messages,
                render,
                tools,
                request.add_special_tokens,
                request.draft_texts,
            )
        )
        return rid

    def submit_prompt(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        on_update: UpdateCallback,
        add_special_tokens: bool = True,
    ) -> str:
        rid = self._new_id()
        self._commands.put(
            SubmitPrompt(rid, params, on_update, time.monotonic(), prompt, add_special_tokens)
        )
        return rid

    def _new_id(self) -> str:
        with self._id_lock:
            rid = f"chat-{self._next_id}"
            self._next_id += 1
        return rid

    def cancel(self, request_id: str) -> None:
        self._commands.put(Cancel(request_id))

    def pin_system_prompt(
        self, system_prompt: str, tools: list[dict[str, Any]] | None = None
    ) -> None:
        """Prefill a persona's system prompt (with the ``tools`` its chats offer, as the chat
        template renders them) once and pin its blocks for every session to share."""
        self._commands.put(Pin(system_prompt, tools))

    # -- the loaded model, for serve (see `ServingClient`; asked only once ready) ----------------
    def _loaded(self) -> LLMEngine:
        engine = self.engine
        if engine is None:
            raise RuntimeError("the engine was asked for before the model loaded")
        return engine

    def token_text(self, token_id: int) -> str:
        return self._loaded().tokenizer.decode([token_id])

    def tool_grammar(self, tools: list[dict[str, Any]], parallel: bool) -> str:
        engine = self._loaded()
        tokenizer = engine.tokenizer

        def token_id(text: str) -> int | None:
            ids = tokenizer.encode(text, add_special_tokens=False)
            return ids[0] if len(ids) == 1 else None

        return engine.tool_format.grammar(tools, parallel, token_id)

    def compile_grammar(self, spec: Structured) -> Future[Any]:
        return self._loaded().grammars.compile(spec)

    def reading(self) -> str:
        """How the model's tool calls and thinking are read from its replies (`chatpage serve`
        says so once ready)."""
        engine = self._loaded()
        markers = engine.reasoning
        thinking = (
            f"{markers.open}...{markers.close} as reasoning_content"
            if markers
            else "none (the chat template declares no markers)"
        )
        return f"{engine.tool_format.describe()}; thinking: {thinking}"

    def stats(self) -> EngineStats | None:
        """The latest snapshot (taken after every engine step); None until the model is ready."""
        return self._stats

    # -- the engine thread -------------------------------------------------------------------------
    def _status(self, status: EngineStatus) -> None:
        self.status = status
        self._on_status(status)

    def _progress(self, text: str) -> None:
        """A load's or a kernel build's progress line (`LLMEngine.from_pretrained`, `ops`)."""
        self._status(EngineStatus(StatusKind.PROGRESS, text))

    def _run(self) -> None:
        import torch  # the slow imports (~2 s): here, not before the app's first frame

        from chatpage.engine.llm_engine import LLMEngine
        from chatpage.engine.model import ops

        torch.set_num_threads(self.config.threads)  # this thread's own count (the UI has its own)
        try:
            t0 = time.perf_counter()
            engine = LLMEngine.from_pretrained(self.model, self.config, progress=self._progress)
            # build (first run) or load the native kernels now, not in the first reply
            ops.set_notify(self._progress)
            ops.available(engine.device)
        except Exception as e:  # reported to the UI, which keeps running
            self.error = log_error(e, f"loading the model {self.model or '(default)'}")
            self._status(EngineStatus(StatusKind.ERROR, self.error))
            self._ready.set()
            self._answer_with_errors(self._commands, "the model did not load")
            return
        self.load_seconds = time.perf_counter() - t0
        self.engine = engine
        self.model_name = engine.model_name
        self.max_model_len = engine.max_model_len
        self.vocab_size = engine.model.vocab_size
        self.warnings = engine.warnings
        self.thinking_switch = thinking_switch(getattr(engine.tokenizer, "chat_template", None))
        try:
            self.counter = TokenCounter(engine.tokenizer, engine.model_name)
        except Exception as e:  # a template that cannot render a short chat: estimates instead
            self.warnings.append(f"prompt sizes are estimated: {log_error(e, 'token counts')}")
        self._stats = engine.stats()
        self._tokenizer_thread = threading.Thread(
            target=self._tokenize, args=(engine,), name="chatpage-tokenizer", daemon=True
        )
        self._tokenizer_thread.start()
        self._ready.set()
        self._status(READY)
        reported = len(self.warnings)  # the load's warnings: shown by the UI at "ready"
        while not self._stopping:
            self._drain(engine, block=not engine.has_unfinished())
            self._unpark(engine)
            if self._stopping or not engine.has_unfinished():
                continue
            try:
                updates = engine.step()
            except Exception as e:  # an engine bug must not take the UI down silently
                if not self._step_failed(engine, e):
                    self._answer_with_errors(self._work, "the engine stopped")
                    return
                continue
            for update in updates:
                self._dispatch(update)
            self._stats = engine.stats()
            while len(self.warnings) > reported:  # raised while stepping (e.g. CUDA graphs off)
                self._status(EngineStatus(StatusKind.WARNING, self.warnings[reported]))
                reported += 1
        engine.close()  # (the disk tier's queued blocks written)

    def _step_failed(self, engine: LLMEngine, error: Exception) -> bool:
        """A step raised (one request's values fail that request alone, in the engine: this is
        the model or the device): every request and every pinning prefix in the engine ends with
        the error, alike. Returns whether the engine can go on: not when its blocks no longer
        add up (then `error` says so, for good)."""
        why = f"{type(error).__name__}: {log_error(error, 'engine step')}"
        for rid in list(engine.groups):
            update = engine.abort(rid, FinishReason.ERROR, why)
            if update is not None:
                self._dispatch(update)
        for rid in list(self._callbacks):  # (refused at submit, its end not sent yet)
            self._fail(rid, why)
        self._parked.clear()  # (failed just now)
        problems = engine.bm.audit()
        if problems:
            self.error = f"{why}; the KV cache no longer adds up ({problems[0]})"
        self._status(EngineStatus(StatusKind.ERROR, f"the engine failed: {self.error or why}"))
        return not problems

    def _drain(self, engine: LLMEngine, block: bool) -> None:
        """Run the queued commands; with ``block``, wait for one first (an idle engine thread
        sleeps here until there is work or `close`, looking at parked submits now and then)."""
        try:
            if block:
                cmd = self._work.get(timeout=PARKED_POLL_S if self._parked else None)
            else:
                cmd = self._work.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(engine, cmd)
            try:
                cmd = self._work.get_nowait()
            except queue.Empty:
                return

    def _tokenize(self, engine: LLMEngine) -> None:
        """The tokenizer thread: a request's messages or text, and a persona's system prompt,
        become token ids here, so that the engine thread never stops stepping the others while
        a long prompt is tokenized; a prompt far longer than the context window is refused by
        its characters first. Commands reach the engine thread in the order they were given (a
        cancel never overtakes its submit)."""
        while not self._stopping:
            cmd = self._commands.get()
            try:
                self._work.put(self._prepare(engine, cmd))
            except Exception as e:  # bad input or a template error: this command fails alone
                assert not isinstance(cmd, Cancel | Wake)  # (those pass as they are)
                self._work.put(Failed(cmd, log_error(e, f"engine command {cmd.kind}")))

    def _prepare(self, engine: LLMEngine, cmd: ToTokenizer) -> ToEngine:
        """``cmd`` as the engine thread takes it: a prompt as its token ids."""
        match cmd:
            case SubmitChat(messages=messages, tools=tools):
                self._check_length(messages, tools)
                ids = cmd.render(engine.tokenizer, messages)
                if cmd.add_special_tokens:
                    ids = with_special_tokens(engine.tokenizer, ids)
                if cmd.draft_texts:
                    sources = [
                        engine.tokenizer.encode(t, add_special_tokens=False)
                        for t in cmd.draft_texts
                    ]
                    cmd = dataclasses.replace(
                        cmd, params=dataclasses.replace(cmd.params, draft_source=sources)
                    )
                return self._tokenized(cmd, ids, True, bool(tools))
            case SubmitPrompt(prompt=str(text)):
                self._check_length(text)
                ids = engine.tokenizer.encode(text, add_special_tokens=cmd.add_special_tokens)
                return self._tokenized(cmd, ids, False, False)
            case SubmitPrompt(prompt=ids):
                return self._tokenized(cmd, list(ids), False, False)
            case Pin(system_prompt, tools):
                return PinIds(persona_prefix(engine.tokenizer, system_prompt, tools))
            case Cancel() | Wake():
                return cmd

    @staticmethod
    def _tokenized(cmd: Request, ids: list[int], chat: bool, tool_calls: bool) -> Tokenized:
        return Tokenized(cmd.rid, cmd.params, cmd.on_update, cmd.t0, ids, chat, tool_calls)

    def _check_length(
        self,
        prompt: str | list[int] | list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
    ) -> None:
        """ValueError for a prompt whose text (`prompt_chars`: every text it renders, the
        ``tools`` offered included) cannot fit the context window whatever its tokens (no token
        is longer than `CHARS_PER_TOKEN` characters), before any of it is tokenized."""
        chars, tool_chars = prompt_chars(prompt), prompt_chars([], tools)
        if chars + tool_chars > CHARS_PER_TOKEN * self.max_model_len:
            of_tools = f", {tool_chars} of them the tools offered" if tool_chars else ""
            fix = "offer fewer or shorter tools" if tool_chars > chars else "shorten it"
            raise ValueError(
                f"the prompt is {chars + tool_chars} characters{of_tools}, far more than the "
                f"context window of {self.max_model_len} tokens (max_model_len) holds; {fix}"
            )

    def _handle(self, engine: LLMEngine, cmd: ToEngine) -> None:
        """Run one command; a failure is reported (on its request, or as a status line for a pin)
        and the thread keeps serving."""
        try:
            match cmd:
                case Tokenized(rid=rid, params=params):
                    self._callbacks[rid] = (cmd.on_update, cmd.t0)
                    spec = params.structured
                    if spec is not None and not engine.grammars.compile(spec).done():
                        self._parked[rid] = (cmd, time.monotonic())  # the engine steps on
                        return
                    engine.add_request(
                        cmd.ids,
                        params,
                        request_id=rid,
                        split_thinking=cmd.chat,
                        tool_calls=cmd.tool_calls,
                        chat=cmd.chat,
                    )
                case Cancel(rid):
                    update = engine.abort(rid)
                    if update is not None:
                        self._dispatch(update)
                    elif self._parked.pop(rid, None) is not None:
                        self._end(rid, FinishReason.ABORT)
                case PinIds(ids):
                    engine.pin_prefix(ids)
                case Failed(command, why):  # (on the tokenizer thread)
                    self._failed(command, why)
                case Wake():
                    pass
        except Exception as e:  # a request that cannot run: this command fails, not the thread
            self._failed(cmd, log_error(e, f"engine command {cmd.kind}"))
        self._stats = engine.stats()

    def _unpark(self, engine: LLMEngine) -> None:
        """Hand the engine the parked submits whose grammar has compiled (or failed to: then
        add_request says why); fail those that waited `COMPILE_TIMEOUT_S`."""
        now = time.monotonic()
        for rid, (cmd, since) in list(self._parked.items()):
            spec = cmd.params.structured
            assert spec is not None  # (parked for it)
            if engine.grammars.compile(spec).done():
                del self._parked[rid]
                self._handle(engine, cmd)
            elif now - since > COMPILE_TIMEOUT_S:
                del self._parked[rid]
                self._failed(cmd, str(too_slow(spec)))

    def _failed(self, cmd: Command, why: str) -> None:
        """Report a command that failed: on its request, or as a status line for a pin."""
        if isinstance(cmd, Request):
            self._callbacks[cmd.rid] = (cmd.on_update, cmd.t0)
            self._fail(cmd.rid, why)
        else:
            self._status(EngineStatus(StatusKind.ERROR, f"{cmd.kind} failed: {why}"))

    def _answer_with_errors(
        self, commands: queue.SimpleQueue[ToTokenizer] | queue.SimpleQueue[ToEngine], why: str
    ) -> None:
        """No model (or a broken engine): every submit from ``commands``, queued or later, gets
        a final error update, ``why`` and `error`."""
        while not self._stopping:
            cmd = commands.get()
            if isinstance(cmd, Failed):
                cmd = cmd.command
            if isinstance(cmd, Request):
                self._callbacks[cmd.rid] = (cmd.on_update, cmd.t0)
                self._fail(cmd.rid, f"{why}: {self.error}")

    def _fail(self, rid: str, why: str) -> None:
        """A request the engine does not hold: its one update ends it with ``why``."""
        self._end(rid, FinishReason.ERROR, why)

    def _end(self, rid: str, reason: FinishReason, why: str | None = None) -> None:
        """A request the engine does not hold: its one update ends it with ``reason``."""
        entry = self._callbacks.get(rid)
        if entry is not None:
            self._dispatch(
                final_update(rid, reason, error=why, elapsed_s=time.monotonic() - entry[1])
            )

    def _dispatch(self, update: RequestUpdate) -> None:
        entry = self._callbacks.get(update.request_id)
        if entry is None:  # a pinned prefix, or a request of the engine's own
            return
        if update.finished:
            del self._callbacks[update.request_id]
        try:
            entry[0](update)
        except Exception as e:  # the consumer's bug: logged, its request stopped, the thread on
            log_error(e, f"the update callback of request {update.request_id}")
            if self._callbacks.pop(update.request_id, None) is not None:
                self._work.put(Cancel(update.request_id))
