"""A GGUF file as a model: its config from the metadata, its tensors under HF names.

The architecture, sizes, RoPE base and special tokens come from llama.cpp's metadata keys
(``{arch}.block_count``, ...), checked before any tensor is touched, so a file chatpage cannot run
is refused in milliseconds. :class:`GGUFSource` hands the tensors out one at a time under the HF
names the rest of the engine uses (``model.layers.0.self_attn.q_proj.weight``), dequantized from
the memory map; llama.cpp's converter stores a Llama's Q and K rows interleaved for its own RoPE,
which is undone here (Qwen2 files are stored as HF has them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from chatpage.engine.gguf_file import GGUFError, GGUFFile
from chatpage.engine.model_config import ModelConfig

# GGUF general.architecture -> the HF model_type it is run as
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2"}

# HF name parts -> GGUF names (per layer, ``blk.{i}.``)
_GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_LAYER = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def gguf_name(hf_name: str) -> str | None:
    """The GGUF tensor name of an HF tensor name (``model.layers.3.mlp.up_proj.weight`` ->
    ``blk.3.ffn_up.weight``); None for a tensor GGUF files of these architectures do not have."""
    if hf_name in _GLOBAL:
        return _GLOBAL[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    module, _, kind = rest.rpartition(".")
    return f"blk.{layer}.{_LAYER[module]}.{kind}" if module in _LAYER else None


def _field(meta: dict[str, Any], key: str, path: Path) -> Any:
    if key not in meta:
        raise GGUFError(f"{path} lacks the metadata key {key!r}; is it a complete model file?")
    return meta[key]


def gguf_config(gf: GGUFFile) -> ModelConfig:
    """The model's config from ``gf``'s metadata; :class:`GGUFError` (one line) for a file of an
    architecture or a RoPE variant the engine does not run."""
    meta, path = gf.metadata, gf.path
    arch = _field(meta, "general.architecture", path)
    if arch not in ARCHITECTURES:
        raise GGUFError(
            f"unsupported architecture {arch!r} in {path.name}; chatpage runs GGUF "
            f"files of {', '.join(ARCHITECTURES)}"
        )
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling != "none" or "rope_freqs.weight" in gf.tensors:
        kind = scaling if scaling != "none" else "llama3 (rope_freqs)"
        raise GGUFError(
            f"{path.name}: RoPE scaling {kind!r} is not supported yet; use a model with plain RoPE"
        )
    heads = int(_field(meta, f"{arch}.attention.head_count", path))
    hidden = int(_field(meta, f"{arch}.embedding_length", path))
    head_dim = int(meta.get(f"{arch}.attention.key_length", hidden // heads))
    if int(meta.get(f"{arch}.rope.dimension_count", head_dim)) != head_dim:
        raise GGUFError(f"{path.name}: partial rotary embeddings are not supported yet")
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = meta.get(f"{arch}.vocab_size", len(tokens) if isinstance(tokens, list) else None)
    embed = gf.tensors.get("token_embd.weight")
    if embed is None:
        raise GGUFError(f"{path.name} has no token_embd.weight tensor")
    return ModelConfig(
        model_type=ARCHITECTURES[arch],
        vocab_size=int(vocab if vocab is not None else embed.shape[0]),
        hidden_size=hidden,
        intermediate_size=int(_field(meta, f"{arch}.feed_forward_length", path)),
        num_hidden_layers=int(_field(meta, f"{arch}.block_count", path)),
        num_attention_heads=heads,
        num_key_value_heads=int(meta.get(f"{arch}.attention.head_count_kv", heads)),
        rms_norm_eps=float(_field(meta, f"{arch}.attention.layer_norm_rms_epsilon", path)),
        max_position_embeddings=int(_field(meta, f"{arch}.context_length", path)),
        tie_word_embeddings="output.weight" not in gf.tensors,
        eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
        rope_parameters={
            "rope_type": "default",
            "rope_theta": float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        },
        head_dim=head_dim,
    )


def _unpermute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's Q/K row order (each head's two rotary halves interleaved) -> HF's."""
    shape = w.shape
    return w.reshape(heads, shape[0] // heads // 2, 2, *shape[1:]).transpose(1, 2).reshape(shape)


class GGUFSource:
    """The tensors of a GGUF file by HF name, dequantized to fp32 one at a time (the
    :class:`chatpage.engine.weights.TensorSource` of a GGUF)."""

    def __init__(self, gf: GGUFFile, config: ModelConfig) -> None:
        self.gf = gf
        self.config = config
        self.arch = gf.metadata["general.architecture"]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and gguf_name(name) in self.gf.tensors

    def load(self, name: str) -> torch.Tensor:
        tensor = gguf_name(name)
        if tensor is None:
            raise KeyError(name)
        w = self.gf.dequantize(tensor)
        if self.arch == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):
            return _unpermute(w, self.config.num_attention_heads)
        if self.arch == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
            return _unpermute(w, self.config.num_key_value_heads)
        return w
