"""What a remote OpenAI-compatible server is and can do, probed once at start.

``/v1/models`` (every server: the model id, ``owned_by``, often ``max_model_len``), then
``/version`` (vLLM; chatpage serve says ``"server": "chatpage"``), ``/server_info`` (SGLang),
``/props`` (llama-server) and ``/metrics``. The answers become a `Backend`: its name, the model,
the context length and a capability set the client follows (and tells the user about).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

from chatpage.wire.errors import read_error
from chatpage.wire.sampling import VLLM_TOP_K_OFF, Dialect

LABELS = {
    "vllm": "vLLM",
    "sglang": "SGLang",
    "llamacpp": "llama-server",
    "llama-cpp-python": "llama-cpp-python",
    "chatpage": "chatpage",
    "openai": "OpenAI-compatible server",
}
ONE_SAMPLE = ("llamacpp", "llama-cpp-python")  # answer one choice per request, whatever n is
METRICS_HINT = {
    "sglang": "start SGLang with --enable-metrics",
    "llamacpp": "start llama-server with --metrics",
    "llama-cpp-python": "llama-cpp-python's server has none",
}
# what top_k "off" is sent as (None: leave the field out)
TOP_K_OFF = {
    "vllm": VLLM_TOP_K_OFF,
    "sglang": VLLM_TOP_K_OFF,
    "llamacpp": 0,
    "llama-cpp-python": 0,
    "chatpage": 0,
    "openai": None,
}
TOKENS_BY_ID = ("vllm", "chatpage")  # backends that take return_tokens_as_token_ids


class BackendError(Exception):
    """The server cannot be used (refused the key, serves no such model); one line."""


class BackendNotReady(Exception):
    """The server answers but is not ready yet (502/503/504: loading, restarting); retry."""


@dataclass
class Backend:
    """A probed server. ``capabilities`` holds "beam", "n", "vllm_extras" (top_k,
    stop_token_ids, ignore_eos, length_penalty), "metrics" and "stats" (chatpage's own)."""

    url: str
    name: str  # a key of LABELS
    model: str
    max_model_len: int
    version: str | None = None
    capabilities: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)
    """What the server said that could not be used (and was ignored), one line each."""

    @property
    def label(self) -> str:
        return LABELS[self.name] + (f" {self.version}" if self.version else "")

    def can(self, capability: str) -> bool:
        return capability in self.capabilities

    @property
    def dialect(self) -> Dialect:
        """How this server wants a request's fields."""
        return Dialect(TOP_K_OFF[self.name], self.can("vllm_extras"), self.name in TOKENS_BY_ID)

    def notes(self) -> list[str]:
        """What this backend cannot do and what it said that was ignored, one line each, for
        the user to see."""
        out = list(self.problems)
        if not self.can("beam"):
            out.append(
                f"{self.label} has no beam search (vLLM has; SGLang with --enable-beam-search)"
            )
        if not self.can("n"):
            out.append(
                f"{self.label} answers one sample per request: n samples are sent as "
                "n requests with seeds seed+i"
            )
        if not self.can("metrics"):
            hint = METRICS_HINT.get(self.name, "start the server with --enable-metrics")
            out.append(f"{self.label} serves no /metrics: the gauge has no figures; {hint}")
        return out


async def _json(client: httpx.AsyncClient, path: str) -> Any:
    """The JSON at ``path``, or None when the server does not have it."""
    try:
        r = await client.get(path)
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    try:
        return r.json()
    except ValueError:
        return None


def error_message(response: httpx.Response) -> str:
    """The server's own words for an HTTP error (OpenAI, vLLM and llama-server shapes)."""
    try:
        body = response.json()
    except ValueError:
        return (
            response.text.strip().splitlines()[0]
            if response.text.strip()
            else response.reason_phrase
        )
    return read_error(body) or str(body)


async def probe(client: httpx.AsyncClient, url: str, model: str | None = None) -> Backend:
    """Probe the server behind ``client``; raises `BackendError`, `BackendNotReady` (and
    httpx's transport errors)."""
    r = await client.get("/v1/models")
    if r.status_code == 401:
        raise BackendError(f"{url} wants an API key ({error_message(r)}); set CHATPAGE_API_KEY")
    if r.status_code in (502, 503, 504):
        raise BackendNotReady(f"{url} is not ready: {error_message(r)}")
    if r.status_code != 200:
        raise BackendError(f"{url}/v1/models answered {r.status_code}: {error_message(r)}")
    try:
        listed = r.json().get("data", [])
    except (ValueError, AttributeError):
        raise BackendError(
            f"{url}/v1/models is not an OpenAI model list; is this an OpenAI-compatible server?"
        ) from None
    models = (
        [m for m in listed if isinstance(m, dict) and isinstance(m.get("id"), str)]
        if isinstance(listed, list)
        else []
    )
    if not models:
        raise BackendError(f"{url} serves no model (/v1/models is empty)")
    chosen = next((m for m in models if m["id"] == model), None) if model else models[0]
    if chosen is None:
        ids = ", ".join(m["id"] for m in models)
        raise BackendError(f"{url} does not serve {model!r}; it serves {ids}")
    owner = str(chosen.get("owned_by", "")).lower()
    version = await _json(client, "/version")
    server_info = await _json(client, "/server_info") if owner != "vllm" else None
    props = await _json(client, "/props") if owner not in ("vllm", "sglang") else None
    if owner == "chatpage" or (isinstance(version, dict) and version.get("server") == "chatpage"):
        name = "chatpage"
    elif owner == "vllm":
        name = "vllm"
    elif owner == "sglang" or isinstance(server_info, dict):
        name = "sglang"
    elif owner == "llamacpp" or isinstance(props, dict):
        name = "llamacpp"
    elif owner == "me":  # what llama-cpp-python's server says
        name = "llama-cpp-python"
    elif isinstance(version, dict) and "version" in version:
        name = "vllm"
    else:
        name = "openai"
    context, where = chosen.get("max_model_len"), "/v1/models max_model_len"
    if context is None and isinstance(server_info, dict):
        context, where = server_info.get("context_length"), "/server_info context_length"
    if context is None and isinstance(props, dict):
        context, where = (
            (props.get("default_generation_settings") or {}).get("n_ctx"),
            "/props n_ctx",
        )
    window, problems = _context_window(context, f"{url}{where}")
    caps = set()
    if name in ("vllm", "chatpage") or (
        isinstance(server_info, dict) and server_info.get("enable_beam_search")
    ):
        caps.add("beam")
    if name not in ONE_SAMPLE:
        caps.add("n")
    if name in ("vllm", "sglang", "chatpage"):
        caps.add("vllm_extras")
    if name == "chatpage":
        caps.add("stats")
    try:
        metrics = await client.get("/metrics")
        if metrics.status_code == 200 and "# TYPE" in metrics.text:
            caps.add("metrics")
    except httpx.HTTPError:
        pass
    number = version.get("version") if isinstance(version, dict) else None
    if name == "sglang" and isinstance(server_info, dict):
        number = server_info.get("version", number)
    return Backend(
        url,
        name,
        chosen["id"],
        window,
        str(number) if number and name != "chatpage" else None,
        caps,
        problems,
    )


def _context_window(value: object, where: str) -> tuple[int, list[str]]:
    """The context length a server gave (0: it did not say), and a line if it is unusable."""
    if value is None:
        return 0, []
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value, []
    return 0, [
        f"{where} is {value!r}, not a number of tokens; ignored (prompts are not checked "
        "against the context window before they are sent)"
    ]
