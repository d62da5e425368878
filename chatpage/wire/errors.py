"""Errors on the wire: the ``{"error": {...}}`` body a server answers, and reading one back."""

from __future__ import annotations

from typing import Any

_KINDS = {
    400: "BadRequestError",
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    408: "RequestTimeoutError",
    413: "RequestTooLargeError",
    415: "UnsupportedMediaTypeError",
    503: "ServiceUnavailableError",
}


def error_body(message: str, status: int = 500, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error object (as a whole answer's body, or as a stream's last chunk)."""
    return {
        "error": {
            "message": message,
            "type": _KINDS.get(status, "InternalServerError"),
            "param": param,
            "code": status,
        }
    }


class ApiError(Exception):
    """An error answered as `error_body` with an HTTP status."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.status, self.param)


def bad_value(name: str, allowed: str, value: Any) -> ApiError:
    """A 400 naming the request field ``name`` and what it must be."""
    return ApiError(400, f"{name} must be {allowed}, got {value!r}", name)


def read_error(body: Any) -> str | None:
    """The server's own words in an error body (OpenAI's, vLLM's and llama-server's shapes);
    None when it holds none."""
    if not isinstance(body, dict):
        return None
    err = body.get("error", body)
    if isinstance(err, dict) and err.get("message"):
        return str(err["message"])
    if isinstance(err, str):
        return err
    return str(body["message"]) if body.get("message") else None
