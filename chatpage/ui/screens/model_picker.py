"""ModelPicker: the model to switch to: the default model, the configured one, the configured
backend (an OpenAI-compatible server), the local models found (loaded before, in ``models_dirs``,
in the cache: `chatpage.config.models`; pulled from Hugging Face: `chatpage.hub`), or a local
model directory, .gguf file or server URL typed (with a folder's directories and .gguf files
listed); or a model to pull from Hugging Face (``OWNER/NAME[:QUANT]`` typed), or the pull
running to cancel."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from rich.text import Text
from textual.widgets import Input
from textual.widgets.option_list import Option

from chatpage.config.models import FoundModel, find_models
from chatpage.config.settings import format_size
from chatpage.hub.refs import parse_ref
from chatpage.ui.completion import path_completions
from chatpage.ui.screens.list_dialog import ListDialog
from chatpage.ui.text import clean

DEFAULT_ID = "\x00default"
"""The option id of the default model (not a path anyone can type)."""
PULL_ID = "\x00pull"
"""The option that starts typing a Hugging Face model to pull (``hf.co/``...)."""
PULL_REF = "\x00pull:"
"""The prefix of the option that pulls the ``REPO[:QUANT]`` after it."""
CANCEL_PULL_ID = "\x00cancel-pull"
HUB_PREFIX = "hf.co/"
PULLED_ORIGIN = "Hugging Face"


@dataclass(frozen=True)
class PullChoice:
    """What the picker asks of a pull: fetch ``ref`` (``REPO[:QUANT]``), or (None) cancel the
    pull running."""

    ref: str | None


def offered_models(models_dirs: Iterable[str] = ()) -> list[FoundModel]:
    """The local models to offer (`find_models`), then the models pulled from Hugging Face, each
    by the ``REPO[:QUANT]`` that /model and ``--model`` take (reads the disk: off the UI thread)."""
    from chatpage.hub.cache import pulled_models  # huggingface_hub: not at the app's start

    return find_models(models_dirs) + [
        FoundModel(str(m.ref), f"{PULLED_ORIGIN} · {format_size(m.size)}") for m in pulled_models()
    ]


def is_backend_url(target: str) -> bool:
    """Whether ``target`` names a server (an OpenAI-compatible backend) rather than a local model."""
    return target.startswith(("http://", "https://"))


def model_problem(target: str) -> str | None:
    """Why ``target`` cannot be a model (one line), or None when it looks like one: a directory
    with a config.json, a .gguf file, or a server URL (reached when the switch happens)."""
    if is_backend_url(target):
        return None
    path = Path(target).expanduser()
    if not path.exists() and parse_ref(target) is not None:
        from chatpage.hub.cache import find_pulled

        if find_pulled(target) is not None:
            return None
        return f"{target}: not pulled yet; type it in /model to pull it from Hugging Face"
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


class ModelPicker(ListDialog[str | PullChoice]):
    """Dismisses with the model path picked ("" for the default model), a `PullChoice`, or None
    on escape. ``pulling``: the model being pulled, if one is (the picker offers to cancel it)."""

    def __init__(
        self,
        current: str | None,
        configured: str | None,
        backend: str | None = None,
        found: list[FoundModel] | None = None,
        pulling: str | None = None,
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
        self.pulling = pulling

    def options(self, text: str) -> list[Option]:
        text = text.strip()
        options = []
        if not text:
            if self.pulling:
                label = Text(f"cancel the pull of {clean(self.pulling)}", style="bold")
                options.append(Option(label, id=CANCEL_PULL_ID))
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
            label = Text("pull from Hugging Face…", style="bold")
            label.append("  OWNER/NAME[:QUANT]; the quant of a GGUF repo: Q4_K_M by default")
            options.append(Option(label, id=PULL_ID))
            return options
        ref = parse_ref(text)
        hub = ref is not None and not Path(text).expanduser().exists()
        if not hub and model_problem(text) is None:
            options.append(Option(self._label(text, text == self.current), id=text))
        for path in path_completions(text):  # a relative path looks like OWNER/NAME too
            if path != text and (path.endswith("/") or path.endswith(".gguf")):
                options.append(Option(Text(clean(path)), id=path))
        return options + (self._hub_options(str(ref)) if hub else [])

    def _hub_options(self, ref: str) -> list[Option]:
        """For a typed ``REPO[:QUANT]``: the models pulled that it starts, then pulling it."""
        options = [
            Option(self._label(m.path, self.current == m.path).append("  pulled", "dim"), m.path)
            for m in self.found
            if m.origin.startswith(PULLED_ORIGIN) and m.path.lower().startswith(ref.lower())
        ]
        label = Text(f"pull {ref} from Hugging Face", style="bold")
        options.append(Option(label, id=PULL_REF + ref))
        return options

    def result(self, option_id: str) -> str | PullChoice | None:
        if option_id == CANCEL_PULL_ID:
            return PullChoice(None)
        if option_id.startswith(PULL_REF):
            return PullChoice(option_id.removeprefix(PULL_REF))
        return "" if option_id == DEFAULT_ID else option_id

    def empty_note(self, text: str) -> str:
        text = text.strip()
        if text.startswith(HUB_PREFIX):
            return "type a Hugging Face model: OWNER/NAME[:QUANT]"
        return model_problem(text) or "nothing matches"

    def _pick(self, option_id: str | None) -> None:
        if option_id == PULL_ID:
            self.query_one("#dialog-input", Input).value = HUB_PREFIX
            return
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
