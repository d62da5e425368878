"""The Textual UI; it talks to the engine only through `chatpage.engine.client`."""

from chatpage.ui.app import ChatApp, run_app

__all__ = ["ChatApp", "run_app"]
