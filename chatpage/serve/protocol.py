"""Request bodies of the OpenAI-compatible API -> validated `ApiRequest`s (or `ApiError`s).

Field names follow the OpenAI API plus vLLM's extras (``top_k``, ``use_beam_search``,
``length_penalty``, ``ignore_eos``, ``stop_token_ids``, ``return_tokens_as_token_ids``). Unknown
fields are ignored; a bad value is a 400 naming the field. Value ranges are `SamplingParams`' own
checks, reported under the API's field names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from chatpage.engine.sampling_params import SamplingParams

DEFAULT_MAX_TOKENS = 1024
"""max_tokens when a request gives none (the context window still ends a reply first)."""

_ROLES = ("system", "developer", "user", "assistant")
# SamplingParams' field -> the request field a client set it with
_API_NAMES = {"beam_width": "n", "max_tokens": "max_tokens", "logprobs": "logprobs"}


class ApiError(Exception):
    """An error answered as ``{"error": {...}}`` with an HTTP status."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> dict[str, Any]:
        kind = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
                503: "ServiceUnavailableError"}.get(self.status, "InternalServerError")
        return {"error": {"message": self.message, "type": kind, "param": self.param,
                          "code": self.status}}


@dataclass
class ApiRequest:
    """One validated request: a chat (``messages``) or a completion (``prompt``)."""

    kind: str  # "chat" | "completion"
    model: str | None
    params: SamplingParams
    messages: list[dict[str, str]] = field(default_factory=list)
    prompt: str | list[int] = ""
    stream: bool = False
    include_usage: bool = False
    continue_final_message: bool = False  # the last message, a reply, goes on (vLLM's name)
    tokens_as_ids: bool = False  # logprobs name tokens "token_id:N" (vLLM's
    # return_tokens_as_token_ids)

    @property
    def beam(self) -> bool:
        return self.params.use_beam_search

    @property
    def logprobs(self) -> bool:
        """The answer carries per-token logprobs (each with ``params.top_logprobs``
        alternatives)."""
        return self.params.logprobs is not None


def _bad(name: str, allowed: str, value: Any) -> ApiError:
    return ApiError(400, f"{name} must be {allowed}, got {value!r}", name)


def _flag(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _bad(name, "true or false", value)
    return value


def _text_content(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"{where}.content", "a string or a list of text parts", content)
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text" \
                or not isinstance(part.get("text"), str):
            raise ApiError(400, f"{where}.content[{j}] must be a text part "
                                '({"type": "text", "text": "..."}); only text is supported',
                           f"{where}.content")
        texts.append(part["text"])
    return "".join(texts)


def parse_messages(raw: Any) -> list[dict[str, str]]:
    if not isinstance(raw, list) or not raw:
        raise _bad("messages", "a non-empty list of {role, content} objects", raw)
    messages = []
    for i, m in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _bad(where, "an object with role and content", m)
        role = m.get("role")
        if role not in _ROLES:
            raise _bad(f"{where}.role", f"one of {', '.join(_ROLES)}", role)
        role = "system" if role == "developer" else role
        messages.append({"role": role, "content": _text_content(m.get("content"), where)})
    return messages


def parse_prompt(raw: Any) -> str | list[int]:
    if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], str | list):
        raw = raw[0]  # a batch of one
    if isinstance(raw, str):
        return raw
    if isinstance(raw, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
        return list(raw)
    raise _bad("prompt", "a string or a list of token ids (one prompt per request)", raw)


def _sampling(body: dict, kind: str, defaults: dict[str, Any]) -> SamplingParams:
    def given(name: str, fallback: Any = None) -> Any:
        value = body.get(name)
        return fallback if value is None else value

    n = given("n", 1)
    beam = _flag(body, "use_beam_search")
    top_k = given("top_k", defaults.get("top_k", 0))
    if top_k == -1:  # vLLM's "off"
        top_k = 0
    max_tokens = given("max_completion_tokens", given("max_tokens",
                                                      defaults.get("max_tokens",
                                                                   DEFAULT_MAX_TOKENS)))
    stop = given("stop", [])
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list):
        raise _bad("stop", "a string or a list of strings", stop)
    stop_ids = given("stop_token_ids", [])
    if not isinstance(stop_ids, list):
        raise _bad("stop_token_ids", "a list of token ids", stop_ids)
    values = dict(
        n=1 if beam else n, beam_width=n if beam else 0,
        temperature=given("temperature", defaults.get("temperature", 1.0)),
        top_p=given("top_p", defaults.get("top_p", 1.0)), top_k=top_k,
        seed=given("seed", defaults.get("seed")), max_tokens=max_tokens, stop=stop,
        stop_token_ids=stop_ids, ignore_eos=_flag(body, "ignore_eos"),
        length_penalty=given("length_penalty", 1.0),
        logprobs=_logprobs(body, kind),
    )
    for name in ("n", "max_tokens", "top_k", "seed"):  # bools are ints to Python, not here
        if isinstance(values[name], bool):
            raise _bad(name, "an integer", values[name])
    try:
        return SamplingParams(**values)
    except ValueError as e:
        text = str(e).removeprefix("SamplingParams.")
        name = text.split(" ", 1)[0]
        api = _API_NAMES.get(name, name)
        if name == "max_tokens" and body.get("max_completion_tokens") is not None:
            api = "max_completion_tokens"
        if name == "logprobs" and kind == "chat":
            api = "top_logprobs"  # chat's logprobs is a flag; the count is top_logprobs
        raise ApiError(400, api + text[len(name):], api) from None


def _logprobs(body: dict, kind: str) -> Any:
    """`SamplingParams.logprobs` as a request asks (None: no logprobs). Chat: ``logprobs: true``
    and ``top_logprobs: N`` alternatives per token; completions: ``logprobs: N`` (0 = the
    sampled token's only). The range is SamplingParams' own check."""
    name = "top_logprobs" if kind == "chat" else "logprobs"
    count = body.get(name)
    if isinstance(count, bool):  # a bool is an int to Python, not here
        raise _bad(name, "an integer", count)
    if kind != "chat":
        return count
    if not _flag(body, "logprobs"):
        if count:
            raise ApiError(400, f"top_logprobs needs logprobs: true, got top_logprobs {count!r} "
                                "without it", "top_logprobs")
        return None
    return 0 if count is None else count


def parse_request(body: Any, kind: str, defaults: dict[str, Any] | None = None) -> ApiRequest:
    """Validate a decoded JSON body of /v1/chat/completions (``kind`` "chat") or
    /v1/completions ("completion"). ``defaults`` are a persona's sampling defaults."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad("model", "a string", model)
    stream = _flag(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _bad("stream_options", "an object such as {\"include_usage\": true}", options)
    if options and not stream:
        raise ApiError(400, "stream_options is only allowed with stream: true", "stream_options")
    include_usage = _flag(options or {}, "include_usage")
    params = _sampling(body, kind, defaults or {})
    request = ApiRequest(kind, model, params, stream=stream, include_usage=include_usage,
                         tokens_as_ids=_flag(body, "return_tokens_as_token_ids"))
    if kind == "chat":
        request.messages = parse_messages(body.get("messages"))
        request.continue_final_message = _flag(body, "continue_final_message")
        if request.continue_final_message and request.messages[-1]["role"] != "assistant":
            raise ApiError(400, "continue_final_message needs the last message to be the "
                                "assistant's reply to continue", "continue_final_message")
    else:
        request.prompt = parse_prompt(body.get("prompt"))
    return request
