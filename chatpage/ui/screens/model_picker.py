"""ModelPicker: the model to switch to: the default model, the configured one, the configured
backend (an OpenAI-compatible server), the local models found (loaded before, in ``models_dirs``,
in the cache: `chatpage.config.models`), or a local model directory, .gguf file or server URL
typed (with a folder's directories and .gguf files listed)."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.widgets import Input
from textual.widgets.option_list import Option

from chatpage.config.models import FoundModel
from chatpage.ui.completion import path_completions
from chatpage.ui.screens.list_dialog import ListDialog
from chatpage.ui.text import clean

DEFAULT_ID = "\x00default"
"""The option id of the default model (not a path anyone can type)."""


def is_backend_url(target: str) -> bool:
    """Whether ``target`` names a server (an OpenAI-compatible backend) rather than a local model."""
    return target.startswith(("http://", "https://"))


def model_problem(target: str) -> str | None:
    """Why ``target`` cannot be a model (one line), or None when it looks like one: a directory
    with a config.json, a .gguf file, or a server URL (reached when the switch happens)."""
    if is_backend_url(target):
        return None
    path = Path(target).expanduser()
    if not path.exists():
        return f"{target}: no such file or folder"
    if path.is_dir():
        return (
            None
            if (path / "config.json").is_file()
            else (
                f"{target}: no config.json in it; pick a Hugging Face model folder or a .gguf file"
            )
        )
    return None if path.suffix == ".gguf" else f"{target}: not a .gguf file or a model folder"


class ModelPicker(ListDialog[str]):
    """Dismisses with the model path picked ("" for the default model), or None on escape."""

    def __init__(
        self,
        current: str | None,
        configured: str | None,
        backend: str | None = None,
        found: list[FoundModel] | None = None,
    ) -> None:
        super().__init__(
            "Switch model: chats stay, replies come from the new model",
            "a model folder, a .gguf file or a server URL (http://host:8000)",
            "model-picker",
        )
        self.current = current
        self.configured = configured
        self.backend = backend
        self.found = found or []

    def options(self, text: str) -> list[Option]:
        text = text.strip()
        options = []
        if not text:
            options.append(
                Option(self._label("the default model", self.current is None), id=DEFAULT_ID)
            )
            if self.configured:
                options.append(
                    Option(
                        self._label(self.configured, self.current == self.configured),
                        id=self.configured,
                    )
                )
            if self.backend:
                options.append(
                    Option(
                        self._label(f"backend {self.backend}", self.current == self.backend),
                        id=self.backend,
                    )
                )
            listed = {self.configured, self.backend}
            for model in self.found:
                if model.path not in listed:
                    label = self._label(model.path, self.current == model.path)
                    label.append(f"  {clean(model.origin)}", style="dim")
                    options.append(Option(label, id=model.path))
            return options
        if model_problem(text) is None:
            options.append(Option(self._label(text, text == self.current), id=text))
        for path in path_completions(text):
            if path != text and (path.endswith("/") or path.endswith(".gguf")):
                options.append(Option(Text(clean(path)), id=path))
        return options

    def result(self, option_id: str) -> str | None:
        return "" if option_id == DEFAULT_ID else option_id

    def empty_note(self, text: str) -> str:
        return model_problem(text.strip()) or "nothing matches"

    def _pick(self, option_id: str | None) -> None:
        if option_id is not None and option_id.endswith("/") and model_problem(option_id):
            self.query_one("#dialog-input", Input).value = option_id  # a folder: look inside it
            return
        super()._pick(option_id)

    @staticmethod
    def _label(name: str, current: bool) -> Text:
        text = Text(clean(name), style="bold")
        if current:
            text.append("  (in use)", style="italic dim")
        return text
