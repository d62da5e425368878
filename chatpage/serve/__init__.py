"""`chatpage serve`: the engine behind an OpenAI-compatible HTTP API (Starlette + uvicorn)."""

from chatpage.serve.app import build_app

__all__ = ["build_app"]
