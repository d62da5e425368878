"""What a user types for a Hub model, ``REPO[:QUANT]``, and which of a repo's files that means.

A GGUF repo holds one model in several quantizations: the quant is read from each file's name
(``...-Q4_K_M.gguf``, ``...q8_0.gguf``, a split model's ``...-Q4_K_M-00001-of-00003.gguf``) and
picked as llama.cpp's ``-hf`` picks it: the one asked for (case-insensitive), else Q4_K_M, else
Q8_0, else the first file. A Hugging Face repo gives its config, tokenizer and safetensors only
(no .bin, ONNX or other formats' copies). Pure functions of the file names: the pull reads them
from the Hub, the cache listing from the disk.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath

from chatpage.vocab import UserError

DEFAULT_QUANTS = ("Q4_K_M", "Q8_0")
"""The quants picked when none is asked for, in order (then the first file)."""

_PREFIXES = ("https://huggingface.co/", "https://hf.co/", "huggingface.co/", "hf.co/")
_REF = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]*[\w])(?::(?P<quant>[\w.-]+))?")
_QUANT = re.compile(
    r"(?<![A-Za-z0-9])((?:I|T)?Q\d(?:_[A-Za-z0-9]+)*|BF16|F16|F32)(?![A-Za-z0-9])", re.IGNORECASE
)
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")
_TOKENIZER_FILES = {
    "config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
}


class HubError(UserError):
    """A pull, listing or removal that cannot go on; the message is one line saying why."""


class PullCancelled(HubError):
    """The pull was cancelled; what it fetched stays for the next pull to resume."""


@dataclass(frozen=True)
class ModelRef:
    """A Hub model as typed: ``owner/name`` and, for a GGUF repo, the quant (None: the default)."""

    repo: str
    quant: str | None = None

    def __str__(self) -> str:
        return f"{self.repo}:{self.quant}" if self.quant else self.repo


def parse_ref(text: str) -> ModelRef | None:
    """``text`` as a `ModelRef` (``hf.co/`` and ``https://huggingface.co/`` prefixes allowed), or
    None when it is not shaped like ``owner/name[:quant]``."""
    text = text.strip()
    for prefix in _PREFIXES:
        if text.startswith(prefix):
            text = text[len(prefix) :]
            break
    match = _REF.fullmatch(text)
    if match is None or ".." in match["repo"]:
        return None
    return ModelRef(match["repo"], match["quant"])


def quant_of(name: str) -> str | None:
    """The quant a GGUF file's name gives (upper case), or None when it names none."""
    stem = _SPLIT.sub("", PurePosixPath(name).name).removesuffix(".gguf")
    found = _QUANT.findall(stem)
    return found[-1].upper() if found else None


@dataclass(frozen=True)
class GGUFModel:
    """One model of a GGUF repo: its quant (None: unnamed) and its files (a split model's parts
    in order; the first is what the loader opens)."""

    quant: str | None
    files: tuple[str, ...]

    @property
    def complete(self) -> bool:
        """Whether every part is there (a split model's names say how many it has)."""
        split = _SPLIT.search(self.files[-1])
        return split is None or len(self.files) == int(split[2])


def gguf_models(names: Iterable[str]) -> list[GGUFModel]:
    """The GGUF models among a repo's files, by file name; a split model's parts together.
    Vision projectors (``mmproj*``) are not models of their own."""
    parts: dict[str, list[str]] = {}
    for name in sorted(names):
        base = PurePosixPath(name).name
        if base.endswith(".gguf") and not base.lower().startswith("mmproj"):
            parts.setdefault(_SPLIT.sub(".gguf", name), []).append(name)
    return [GGUFModel(quant_of(key), tuple(files)) for key, files in parts.items()]


def pick_gguf(repo: str, names: Iterable[str], quant: str | None) -> GGUFModel:
    """The model of ``repo`` that ``quant`` names (case-insensitive), or the default one."""
    models = gguf_models(names)
    if not models:
        raise HubError(f"{repo} has no .gguf files")
    wanted = (quant.upper(),) if quant else DEFAULT_QUANTS
    for q in wanted:
        for model in models:
            if model.quant == q:
                return model
    if quant is None:
        return models[0]
    quants = sorted({m.quant for m in models if m.quant})
    raise HubError(
        f"{repo} has no {quant} file; its quants: {', '.join(quants) or 'none named'}"
        if quants
        else f"{repo} has no {quant} file; its files name no quant"
    )


def hf_files(names: Iterable[str]) -> list[str]:
    """A Hugging Face repo's files chatpage runs it from: config, tokenizer and safetensors
    (top level only: a subfolder holds another format's copy)."""
    return sorted(
        n
        for n in names
        if "/" not in n
        and (n in _TOKENIZER_FILES or n.startswith("tokenizer") or ".safetensors" in n)
        and not n.startswith("consolidated")  # Mistral's second copy of the weights
    )


def is_hf_model(names: Iterable[str]) -> bool:
    """Whether the files hold a model chatpage reads as a folder: a config.json and safetensors."""
    chosen = hf_files(names)
    return "config.json" in chosen and any(n.endswith(".safetensors") for n in chosen)


def choose_files(ref: ModelRef, names: Iterable[str]) -> list[str]:
    """The files of ``ref``'s repo (named ``names``) to fetch or to run: one GGUF model when a
    quant is asked for or the repo has no safetensors model, else the safetensors model."""
    names = list(names)
    if ref.quant is None and is_hf_model(names):
        return hf_files(names)
    if not any(n.endswith(".gguf") for n in names) and ref.quant is None:
        raise HubError(
            f"{ref.repo} has neither .gguf files nor a config.json with safetensors: "
            "chatpage cannot run it"
        )
    return list(pick_gguf(ref.repo, names, ref.quant).files)
