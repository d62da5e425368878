"""What `chatpage serve` takes from a client before it parses a request: a body of at most
``max_body_bytes`` that arrives within ``body_timeout_s``, JSON that is not nested past
Python's recursion limit, and, on a server with no API key, only JSON content from a page of
this machine's own names (a web page can then neither post a form to it nor reach it by
rebinding a DNS name to 127.0.0.1).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from chatpage.wire.errors import ApiError

if TYPE_CHECKING:  # (the CLI reads the defaults without the serve extra)
    from starlette.requests import Request

DEFAULT_MAX_BODY = 4 << 20
"""4 MiB: a whole context window of text many times over, far below what hurts the server."""
DEFAULT_BODY_TIMEOUT_S = 30.0
LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARDS = ("0.0.0.0", "::", "")


@dataclass(frozen=True)
class ServeLimits:
    """The server's limits on what a client sends (`chatpage serve --max-body/--body-timeout`)."""

    max_body_bytes: int = DEFAULT_MAX_BODY
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1:
            raise ValueError(f"the body limit must be at least 1 byte, got {self.max_body_bytes}")
        if not self.body_timeout_s > 0:
            raise ValueError(f"the body timeout must be above 0 s, got {self.body_timeout_s}")


def _too_large(limits: ServeLimits) -> ApiError:
    return ApiError(
        413,
        f"the request body is larger than {limits.max_body_bytes} bytes, this "
        "server's limit (chatpage serve --max-body)",
    )


async def read_json(request: Request, limits: ServeLimits) -> Any:
    """The request's body, decoded: 413 past the size limit (by its Content-Length before
    reading anything, else as it streams in), 408 when it does not arrive in time, 400 for
    what is not JSON."""
    length = request.headers.get("content-length")
    if length is not None:
        if not length.strip().isdigit():
            raise ApiError(400, f"the Content-Length header must be a number, got {length!r}")
        if int(length) > limits.max_body_bytes:
            raise _too_large(limits)
    parts: list[bytes] = []

    async def read() -> None:
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limits.max_body_bytes:
                raise _too_large(limits)
            parts.append(chunk)

    try:
        await asyncio.wait_for(read(), limits.body_timeout_s)
    except TimeoutError:
        raise ApiError(
            408,
            f"the request body did not arrive within {limits.body_timeout_s:g} s "
            "(chatpage serve --body-timeout)",
        ) from None
    try:
        return json.loads(b"".join(parts))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}") from None
    except RecursionError:
        raise ApiError(400, "the request body is JSON nested too deeply to read") from None


def check_keyless(request: Request, bound_host: str) -> None:
    """With no API key: 403 unless the Host header names this server (localhost, 127.0.0.1,
    [::1], the address it listens on, or any address when it listens on all), and 415 for a
    body that is not JSON (a form or text/plain post needs no CORS preflight)."""
    header = request.headers.get("host", "")
    if not _is_own_host(header, bound_host):
        raise ApiError(
            403,
            f"the Host header {header!r} does not name this server; with no API "
            "key chatpage serve answers only localhost, 127.0.0.1, [::1] and "
            "the address it listens on (give it --api-key to serve any name)",
        )
    if request.method == "POST":
        kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if kind != "application/json" and not (
            kind.startswith("application/") and kind.endswith("+json")
        ):
            raise ApiError(
                415,
                f"the request body must be JSON (Content-Type: application/json), "
                f"got {kind or 'no content type'!r}",
            )


def _is_own_host(header: str, bound_host: str) -> bool:
    name = header.strip().lower()
    if name.startswith("["):  # [::1]:8000
        name = name[1:].split("]", 1)[0]
    elif name.count(":") == 1:
        name = name.split(":", 1)[0]
    name = name.rstrip(".")
    bound = bound_host.strip("[]").lower()
    if name in LOCAL_NAMES or name == bound:
        return True
    if bound not in WILDCARDS:
        return False
    try:  # listening on every address: any address (a name could be rebound), no name
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True
