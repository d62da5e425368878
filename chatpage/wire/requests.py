"""Request bodies of /v1/chat/completions and /v1/completions, both ways: `parse_request`
(the server's side: a decoded body -> a validated `ApiRequest`, or an `ApiError`) and
`request_body` (the client's: what to send).

A field chatpage does not implement is a 400 (`FIELDS`), never ignored; a few OpenAI and vLLM
fields are taken at their neutral value only (`NEUTRAL`). A bad value is a 400 naming the
field. vLLM's ``add_special_tokens`` says whether the prompt gets the special tokens the
tokenizer puts around a text (a BOS): by default a completion's text does (as
``tokenizer(text)``), a chat's rendering does not (its template writes them). Besides the
sampling fields (`chatpage.wire.sampling`, with ``logit_bias`` and the
structured outputs of `chatpage.wire.structured`), the tools (`chatpage.wire.tools`) and vLLM's
``continue_final_message``, ``add_generation_prompt`` and ``return_tokens_as_token_ids`` are
read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from chatpage.engine.sampling_params import SamplingParams
from chatpage.vocab import SAMPLING_RULES, Role
from chatpage.wire.errors import ApiError, bad_value
from chatpage.wire.sampling import CHATPAGE, Dialect, read_flag, read_sampling, write_sampling
from chatpage.wire.tools import TOOL, ToolRequest, read_tools, tool_calls_of

DEVELOPER = "developer"
"""OpenAI's newer name of the system role; read as `Role.SYSTEM`."""
ROLES = (Role.SYSTEM, DEVELOPER, Role.USER, Role.ASSISTANT, TOOL)
_COMMON = {
    "model",
    "stream",
    "stream_options",
    "use_beam_search",
    "logit_bias",
    "return_tokens_as_token_ids",
    "add_special_tokens",
    "response_format",
    "structured_outputs",
    "user",
    *(name for rule in SAMPLING_RULES for name in rule.wire),
}
FIELDS = {
    "chat": _COMMON
    | {
        "messages",
        "continue_final_message",
        "add_generation_prompt",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
    },
    "completion": _COMMON | {"prompt"},
}
"""The request fields chatpage reads, per endpoint."""
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "repetition_penalty": (1, 1.0),
    "min_tokens": (0,),
    "min_p": (0, 0.0),
    "best_of": (1,),
    "echo": (False,),
    "suffix": ("",),
    "skip_special_tokens": (True,),
    "include_stop_str_in_output": (False,),
    "store": (False,),
    "spaces_between_special_tokens": (True,),
}
"""Fields chatpage does not implement but takes at the value that does nothing (or null)."""
KINDS = ("chat", "completion", "continue")
"""What a client asks for: a reply to messages, a completion of a prompt, or more of the last
message (a reply cut short: chat with vLLM's continue_final_message)."""


@dataclass
class ApiRequest:
    """One validated request: a chat (``messages``) or a completion (``prompt``)."""

    kind: str  # "chat" | "completion"
    model: str | None
    params: SamplingParams
    messages: list[dict[str, Any]] = field(default_factory=list)
    prompt: str | list[int] = ""
    stream: bool = False
    include_usage: bool = False
    continue_final_message: bool = False  # the last message, a reply, goes on (vLLM's name)
    tokens_as_ids: bool = False  # logprobs name tokens "token_id:N" (vLLM's
    # return_tokens_as_token_ids)
    tools: ToolRequest = field(default_factory=ToolRequest)
    add_special_tokens: bool = False  # the prompt gets the tokenizer's BOS (vLLM's name)

    @property
    def beam(self) -> bool:
        return self.params.use_beam_search

    @property
    def logprobs(self) -> bool:
        """The answer carries per-token logprobs (each with ``params.top_logprobs``
        alternatives)."""
        return self.params.logprobs is not None


def _text_content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_value(f"{where}.content", "a string or a list of text parts", content)
    texts = []
    for j, part in enumerate(content):
        if (
            not isinstance(part, dict)
            or part.get("type") != "text"
            or not isinstance(part.get("text"), str)
        ):
            raise ApiError(
                400,
                f"{where}.content[{j}] must be a text part "
                '({"type": "text", "text": "..."}); only text is supported',
                f"{where}.content",
            )
        texts.append(part["text"])
    return "".join(texts)


def parse_messages(raw: Any) -> list[dict[str, Any]]:
    """The chat history: role and text content, and the tool conversation (an assistant's
    ``tool_calls``, whose content may be null; a ``tool`` result with its ``tool_call_id``)."""
    if not isinstance(raw, list) or not raw:
        raise bad_value("messages", "a non-empty list of {role, content} objects", raw)
    messages: list[dict[str, Any]] = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise bad_value(where, "an object with role and content", m)
        role = m.get("role")
        if role not in ROLES:
            raise bad_value(f"{where}.role", f"one of {', '.join(ROLES)}", role)
        role = str(Role.SYSTEM) if role == DEVELOPER else str(role)
        calls = m.get("tool_calls")
        content = m.get("content")
        message: dict[str, Any] = {
            "role": role,
            "content": ""
            if content is None and (calls or role == TOOL)
            else _text_content(content, where),
        }
        if calls is not None:
            if role != Role.ASSISTANT:
                raise ApiError(
                    400,
                    f"{where}.tool_calls: only an assistant message makes tool calls",
                    f"{where}.tool_calls",
                )
            message["tool_calls"] = tool_calls_of(m, where)
        if role == TOOL:
            call_id = m.get("tool_call_id")
            if not isinstance(call_id, str):
                raise bad_value(f"{where}.tool_call_id", "the id of the call it answers", call_id)
            message["tool_call_id"] = call_id
            if isinstance(m.get("name"), str):
                message["name"] = m["name"]
        messages.append(message)
    return messages


def check_fields(body: dict[str, Any], kind: str) -> None:
    """A 400 for a field chatpage does not implement (one of `NEUTRAL` at another value than
    its neutral one, or a field it does not know)."""
    for name, value in body.items():
        if name in FIELDS[kind] or value is None:
            continue
        if name in NEUTRAL:
            if value not in NEUTRAL[name] or isinstance(value, bool) != isinstance(
                NEUTRAL[name][0], bool
            ):
                raise ApiError(
                    400,
                    f"{name} is not implemented by chatpage: leave it out (or "
                    f"at {NEUTRAL[name][0]!r}), got {value!r}",
                    name,
                )
            continue
        raise ApiError(
            400, f"unknown field {name!r}: chatpage does not implement it; leave it out", name
        )


def parse_prompt(raw: Any) -> str | list[int]:
    if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], str | list):
        raw = raw[0]  # a batch of one
    if isinstance(raw, str):
        return raw
    if isinstance(raw, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
        return list(raw)
    raise bad_value("prompt", "a string or a list of token ids (one prompt per request)", raw)


def parse_request(
    body: Any, kind: str, defaults: dict[str, Any] | None = None, vocab_size: int | None = None
) -> ApiRequest:
    """Validate a decoded JSON body of /v1/chat/completions (``kind`` "chat") or
    /v1/completions ("completion"). ``defaults`` are a persona's sampling defaults;
    ``vocab_size`` the model's (token ids must be below it)."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    check_fields(body, "chat" if kind == "chat" else "completion")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad_value("model", "a string", model)
    stream = read_flag(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise bad_value("stream_options", 'an object such as {"include_usage": true}', options)
    if options and not stream:
        raise ApiError(400, "stream_options is only allowed with stream: true", "stream_options")
    include_usage = read_flag(options or {}, "include_usage")
    params = read_sampling(body, kind, defaults, vocab_size)
    request = ApiRequest(
        kind,
        model,
        params,
        stream=stream,
        include_usage=include_usage,
        tokens_as_ids=read_flag(body, "return_tokens_as_token_ids"),
        add_special_tokens=(
            read_flag(body, "add_special_tokens")
            if body.get("add_special_tokens") is not None
            else kind != "chat"
        ),
    )
    if kind == "chat":
        request.messages = parse_messages(body.get("messages"))
        request.continue_final_message = read_flag(body, "continue_final_message")
        if request.continue_final_message and request.messages[-1]["role"] != Role.ASSISTANT:
            raise ApiError(
                400,
                "continue_final_message needs the last message to be the "
                "assistant's reply to continue",
                "continue_final_message",
            )
        if (
            body.get("add_generation_prompt", True) is not True
            and not request.continue_final_message
        ):
            raise ApiError(
                400,
                "add_generation_prompt false is only taken with continue_final_message true",
                "add_generation_prompt",
            )
        request.tools = read_tools(body)
        if request.tools.forced and params.structured is not None:
            raise ApiError(
                400,
                "a tool_choice that forces a call cannot be combined with "
                "response_format or structured_outputs",
                "tool_choice",
            )
    else:
        request.prompt = parse_prompt(body.get("prompt"))
    return request


def request_body(
    model: str,
    kind: str,
    payload: list[dict[str, str]] | str | list[int],
    params: SamplingParams,
    dialect: Dialect = CHATPAGE,
    tools: ToolRequest | None = None,
) -> dict[str, Any]:
    """What a client sends for ``kind`` (one of `KINDS`): ``payload`` is the messages, or a
    completion's prompt; a chat may offer ``tools`` (and say whether it must call them).
    Streamed with the usage at the end, except beam search (its beams reorder until the end:
    they come whole, at once)."""
    stream = not params.use_beam_search
    body: dict[str, Any] = {
        "model": model,
        "stream": stream,
        **write_sampling(params, kind, dialect),
    }
    body["prompt" if kind == "completion" else "messages"] = payload
    if tools and kind != "completion":
        body.update(tools.fields())
    if kind == "continue":  # vLLM's names (chatpage serve and SGLang read them too)
        body.update(continue_final_message=True, add_generation_prompt=False)
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body
