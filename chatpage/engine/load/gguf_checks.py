"""A GGUF file's config checked against itself and its tensor table, before anything is built.

The sizes in a file's metadata decide what the engine allocates (RoPE tables, the layer list,
every matrix), so a value no model has (``block_count`` 2**31 - 1, ``head_count`` 0, an
``embedding_length`` the embeddings do not have) is refused here in one line, in milliseconds:
each size a whole number in its range, every layer ``blk.0`` ... ``blk.{n-1}`` present with each
matrix of the shape the sizes give it (as llama.cpp's loader requires), and no other layer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chatpage.engine.load.gguf_file import GGUFError, GGUFFile

_REQUIRED = object()


def field(meta: dict[str, Any], key: str, path: Path, default: Any = _REQUIRED) -> Any:
    """Metadata ``key`` (``default`` where it is absent; without one, the key is required)."""
    if key not in meta and default is _REQUIRED:
        raise GGUFError(f"{path} lacks the metadata key {key!r}; is it a complete model file?")
    return meta.get(key, default)


def whole(
    meta: dict[str, Any], key: str, path: Path, default: Any = _REQUIRED, low: int = 1
) -> int:
    """Metadata ``key`` as a whole number of at least ``low`` (``default`` where it is absent;
    without one, the key is required); :class:`GGUFError` (one line) otherwise."""
    value = field(meta, key, path, default)
    if type(value) is not int or value < low:
        shown = value if type(value) in (int, float) else f"a {type(value).__name__}"
        raise GGUFError(f"{path.name}: {key} must be a whole number of at least {low}, not {shown}")
    return value


def positive(meta: dict[str, Any], key: str, path: Path, default: Any = _REQUIRED) -> float:
    """Metadata ``key`` as a number above 0 (``default`` where it is absent, as for `field`)."""
    value = field(meta, key, path, default)
    if type(value) not in (int, float) or not value > 0:
        shown = value if type(value) in (int, float) else f"a {type(value).__name__}"
        raise GGUFError(f"{path.name}: {key} must be a number above 0, not {shown}")
    return float(value)


def check_tensors(gf: GGUFFile, arch: str, fields: dict[str, Any], head_dim: int) -> None:
    """The tensor table agrees with the config ``fields`` (HF names) of an ``arch`` file: the
    embeddings (and output) ``[vocab, hidden]``, and each of the ``num_hidden_layers`` layers
    with its matrices and norms of the shapes the sizes give (optional ones, where present)."""
    n = fields["num_hidden_layers"]
    hidden, ff, vocab = fields["hidden_size"], fields["intermediate_size"], fields["vocab_size"]
    heads, kv = fields["num_attention_heads"], fields["num_key_value_heads"]
    if heads % kv:
        raise GGUFError(
            f"{gf.path.name}: {heads} attention heads do not split into {kv} key/value heads"
        )
    layers = {name.split(".")[1] for name in gf.tensors if name.startswith("blk.")}
    if len(layers) != n or layers != {str(i) for i in range(n)}:
        raise GGUFError(
            f"{gf.path.name}: block_count is {n} but the file has tensors for "
            f"{len(layers)} layers (blk.0 to blk.{n - 1} must each be there, and no others)"
        )
    q, k = heads * head_dim, kv * head_dim
    _shape(gf, "token_embd.weight", (vocab, hidden))
    _shape(gf, "output.weight", (vocab, hidden), required=False)
    _shape(gf, "output_norm.weight", (hidden,))
    if arch == "phi3":
        matrices = {"attn_qkv": (q + 2 * k, hidden), "ffn_up": (2 * ff, hidden)}
    else:
        matrices = {
            "attn_q": (q, hidden),
            "attn_k": (k, hidden),
            "attn_v": (k, hidden),
            "ffn_gate": (ff, hidden),
            "ffn_up": (ff, hidden),
        }
    matrices |= {"attn_output": (hidden, q), "ffn_down": (hidden, ff)}
    norms = ["attn_norm", "ffn_norm"]
    if arch.startswith("gemma"):
        norms += ["post_attention_norm", "post_ffw_norm"]
    for i in range(n):
        for name, shape in matrices.items():
            _shape(gf, f"blk.{i}.{name}.weight", shape)
            _shape(gf, f"blk.{i}.{name}.bias", shape[:1], required=False)
        for name in norms:
            _shape(gf, f"blk.{i}.{name}.weight", (hidden,))
        for name in ("attn_q_norm", "attn_k_norm"):
            _shape(gf, f"blk.{i}.{name}.weight", (head_dim,), required=False)


def _shape(gf: GGUFFile, name: str, shape: tuple[int, ...], required: bool = True) -> None:
    info = gf.tensors.get(name)
    if info is None and required:
        raise GGUFError(f"{gf.path.name} has no tensor {name}, which its config needs")
    if info is not None and info.shape != shape:
        raise GGUFError(
            f"{gf.path.name}: tensor {name} is {list(info.shape)} but the config's sizes "
            f"make it {list(shape)}"
        )
