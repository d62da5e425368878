"""A GGUF file as a model: its config from the metadata, its tensors under HF names.

The architecture, sizes, RoPE base and special tokens come from llama.cpp's metadata keys
(``{arch}.block_count``, ...), checked before any tensor is touched, so a file chatpage cannot run
is refused in milliseconds. :class:`GGUFSource` hands the tensors out one at a time under the HF
names the rest of the engine uses (``model.layers.0.self_attn.q_proj.weight``), dequantized from
the memory map; llama.cpp's converter stores a Llama's Q and K rows interleaved for its own RoPE,
which is undone here (Qwen2 files are stored as HF has them).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from chatpage.engine.load.gguf_checks import check_tensors, field, positive, whole
from chatpage.engine.load.gguf_file import GGUFError, GGUFFile
from chatpage.engine.load.gguf_int4 import IQ4_TYPES, int4_of, is_int4, levels_of
from chatpage.engine.model.model_config import ModelConfig, ModelShape

# GGUF general.architecture -> the HF model_type it is run as
ARCHITECTURES = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma2": "gemma2",
    "gemma3": "gemma3_text",
    "phi3": "phi3",
}
GEMMA = ("gemma2", "gemma3")

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
    "self_attn.q_norm": "attn_q_norm",  # Qwen3, Gemma 3
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}
# Gemma's four norms: llama.cpp's ffn_norm is the one before the MLP
_GEMMA_LAYER = {
    **_LAYER,
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
# Phi-3's fused QKV and gate+up (llama.cpp's ffn_up holds both, the gate first, as HF's does)
_PHI3_LAYER = {
    "self_attn.qkv_proj": "attn_qkv",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}
_LAYER_NAMES = {"gemma2": _GEMMA_LAYER, "gemma3": _GEMMA_LAYER, "phi3": _PHI3_LAYER}


def gguf_name(hf_name: str, arch: str = "llama") -> str | None:
    """The GGUF tensor name of an HF tensor name (``model.layers.3.mlp.up_proj.weight`` ->
    ``blk.3.ffn_up.weight``) in a file of ``arch``; None for a tensor such files do not have."""
    if hf_name in _GLOBAL:
        return _GLOBAL[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    module, _, kind = rest.rpartition(".")
    names = _LAYER_NAMES.get(arch, _LAYER)
    return f"blk.{layer}.{names[module]}.{kind}" if module in names else None


def gguf_config(gf: GGUFFile) -> ModelShape:
    """The model's config from ``gf``'s metadata, checked against its tensor table
    (``engine/load/gguf_checks.py``); :class:`GGUFError` (one line) for a file of an architecture or
    a RoPE variant the engine does not run, or whose values no model has. Llama and Qwen2 files
    give a :class:`ModelConfig`; the others a config of transformers' class for their model type
    (their options: ``engine/model/arch.py``)."""
    try:
        return _config(gf)
    except GGUFError:
        raise
    except (ValueError, TypeError, KeyError, ArithmeticError) as e:  # a value of the wrong kind
        why = f"{type(e).__name__}: {e}".splitlines()[0][:200]
        raise GGUFError(f"{gf.path.name} has malformed metadata ({why})") from None


def _config(gf: GGUFFile) -> ModelShape:
    meta, path = gf.metadata, gf.path
    arch = field(meta, "general.architecture", path)
    if arch not in ARCHITECTURES:
        raise GGUFError(
            f"unsupported architecture {arch!r} in {path.name}; chatpage runs GGUF "
            f"files of {', '.join(ARCHITECTURES)}"
        )
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    linear = arch == "gemma3" and scaling == "linear"  # Gemma 3's global layers (4B and up)
    if (scaling != "none" and not linear) or "rope_freqs.weight" in gf.tensors:
        kind = scaling if scaling != "none" else "llama3 (rope_freqs)"
        raise GGUFError(
            f"{path.name}: RoPE scaling {kind!r} is not supported yet; use a model with plain RoPE"
        )
    heads = whole(meta, f"{arch}.attention.head_count", path)
    hidden = whole(meta, f"{arch}.embedding_length", path)
    head_dim = whole(meta, f"{arch}.attention.key_length", path, hidden // heads)
    rope_dim = whole(meta, f"{arch}.rope.dimension_count", path, head_dim)
    if rope_dim != head_dim and (arch != "phi3" or rope_dim > head_dim):
        raise GGUFError(f"{path.name}: partial rotary embeddings are not supported yet")
    tokens = meta.get("tokenizer.ggml.tokens")
    embed = gf.tensors.get("token_embd.weight")
    if embed is None:
        raise GGUFError(f"{path.name} has no token_embd.weight tensor")
    vocab = len(tokens) if isinstance(tokens, list) else embed.shape[0]
    fields: dict[str, Any] = dict(
        vocab_size=whole(meta, f"{arch}.vocab_size", path, vocab),
        hidden_size=hidden,
        intermediate_size=whole(meta, f"{arch}.feed_forward_length", path),
        num_hidden_layers=whole(meta, f"{arch}.block_count", path),
        num_attention_heads=heads,
        num_key_value_heads=whole(meta, f"{arch}.attention.head_count_kv", path, heads),
        rms_norm_eps=positive(meta, f"{arch}.attention.layer_norm_rms_epsilon", path),
        # (the engine's RoPE tables cover what its KV pool can hold, not all of this)
        max_position_embeddings=whole(meta, f"{arch}.context_length", path),
        tie_word_embeddings="output.weight" not in gf.tensors,
        eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
    )
    check_tensors(gf, arch, fields, head_dim)
    base = positive(meta, f"{arch}.rope.freq_base", path, 10000.0)
    if arch in ("llama", "qwen2"):
        # Mistral and Ministral files are llama files; where the converter writes a window (and
        # which layers slide), the layers keep it
        window = whole(meta, f"{arch}.attention.sliding_window", path, 0, low=0)
        return ModelConfig(
            model_type=ARCHITECTURES[arch],
            rope_parameters={"rope_type": "default", "rope_theta": base},
            head_dim=head_dim,
            sliding_window=window or None,
            layer_types=_layer_types(meta, arch, fields["num_hidden_layers"]) if window else None,
            **fields,
        )
    return _transformers_config(gf, arch, fields, base, head_dim)


def _layer_types(
    meta: dict[str, Any], arch: str, n: int, period: int | None = None
) -> tuple[str, ...]:
    """Each layer's attention kind from ``{arch}.attention.sliding_window_pattern``: a list of
    flags (true: the layer slides), or a period (every period-th layer is full: Gemma 3's 6, the
    default ``period``); without either, every layer slides."""
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern", period)
    if isinstance(pattern, list):
        if len(pattern) != n:
            raise GGUFError(
                f"{arch}.attention.sliding_window_pattern has {len(pattern)} entries for {n} layers"
            )
        sliding = [bool(x) for x in pattern]
    else:
        sliding = [not pattern or bool((i + 1) % int(pattern)) for i in range(n)]
    return tuple("sliding_attention" if s else "full_attention" for s in sliding)


def _transformers_config(
    gf: GGUFFile, arch: str, fields: dict[str, Any], base: float, head_dim: int
) -> ModelShape:
    """The transformers config of a Qwen3 or Gemma 2/3 file, from what llama.cpp's
    converter writes (and, where it writes nothing, what llama.cpp assumes: Gemma's query scale
    by model size, Gemma 3's local RoPE base and its 5 : 1 layer pattern)."""
    import transformers

    meta = gf.metadata
    window = meta.get(f"{arch}.attention.sliding_window")
    rope = {"rope_type": "default", "rope_theta": base}
    if arch == "qwen3":
        return transformers.Qwen3Config(head_dim=head_dim, rope_parameters=rope, **fields)
    if arch == "phi3":
        return _phi3_config(gf, fields, rope, head_dim)
    # Gemma 2 and 3. llama.cpp: the 27B models scale queries by hidden / heads, the others by
    # head_dim
    big = fields["num_hidden_layers"] == {"gemma2": 46, "gemma3": 62}[arch]
    scale = meta.get(f"{arch}.attention.scale")
    scalar = 1 / scale**2 if scale else fields["hidden_size"] // fields["num_attention_heads"]
    gemma = dict(
        head_dim=head_dim,
        sliding_window=window,
        query_pre_attn_scalar=scalar if big or scale else head_dim,
        attn_logit_softcapping=meta.get(f"{arch}.attn_logit_softcapping"),
        final_logit_softcapping=meta.get(f"{arch}.final_logit_softcapping"),
        hidden_activation="gelu_pytorch_tanh",
        **fields,
    )
    if arch == "gemma2":
        return transformers.Gemma2Config(rope_parameters=rope, **gemma)
    full = dict(rope)
    if meta.get("gemma3.rope.scaling.type", "none") == "linear":
        full.update(rope_type="linear", factor=float(meta["gemma3.rope.scaling.factor"]))
    local = positive(meta, "gemma3.rope.freq_base_swa", gf.path, 10000.0)
    return transformers.Gemma3TextConfig(
        layer_types=list(_layer_types(meta, arch, fields["num_hidden_layers"], 6)),
        rope_parameters={
            "full_attention": full,
            "sliding_attention": {"rope_type": "default", "rope_theta": local},
        },
        **gemma,
    )


def _phi3_config(
    gf: GGUFFile, fields: dict[str, Any], rope: dict[str, Any], head_dim: int
) -> ModelShape:
    """The Phi3Config of a Phi-3 / Phi-4-mini file: partial rotary embeddings from the rotary
    dimension, the window (0: none, Phi-4), and LongRoPE from the factor tensors llama.cpp's
    converter writes (``rope_factors_long`` / ``_short``, run as transformers runs them: the
    short factors below the original context, the long ones from there on)."""
    import transformers

    meta = gf.metadata
    orig = int(
        meta.get("phi3.rope.scaling.original_context_length", fields["max_position_embeddings"])
    )
    factors = {k: f"rope_factors_{k}.weight" for k in ("long", "short")}
    present = [k for k, name in factors.items() if name in gf.tensors]
    if len(present) == 1:
        raise GGUFError(f"{gf.path.name} has rope_factors_{present[0]} without its pair")
    if present:
        rope = {
            **rope,
            "rope_type": "longrope",
            "long_factor": gf.dequantize(factors["long"]).tolist(),
            "short_factor": gf.dequantize(factors["short"]).tolist(),
            "original_max_position_embeddings": orig,
        }
        attn = meta.get("phi3.rope.scaling.attn_factor")
        if attn:
            rope["attention_factor"] = float(attn)
    rotary = int(meta.get("phi3.rope.dimension_count", head_dim))
    rope = {**rope, "partial_rotary_factor": rotary / head_dim}
    return transformers.Phi3Config(
        sliding_window=int(meta.get("phi3.attention.sliding_window", 0)) or None,
        original_max_position_embeddings=orig,
        rope_parameters=rope,
        **fields,
    )


def _hf_rows(rows: int, heads: int) -> torch.Tensor:
    """For each of HF's Q/K rows, the row of llama.cpp's order (each head's two rotary halves
    interleaved) that holds it."""
    return torch.arange(rows).view(heads, rows // heads // 2, 2).transpose(1, 2).reshape(-1)


class GGUFSource:
    """The tensors of a GGUF file by HF name, dequantized to fp32 one at a time (the
    :class:`chatpage.engine.model.weights.TensorSource` of a GGUF)."""

    def __init__(self, gf: GGUFFile, config: ModelShape) -> None:
        self.gf = gf
        self.config = config
        self.arch = gf.metadata["general.architecture"]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and gguf_name(name, self.arch) in self.gf.tensors

    def _tensor(self, name: str) -> tuple[str, torch.Tensor | None]:
        """The GGUF tensor of HF tensor ``name`` and, for a llama file's Q and K, the file's row
        of each of HF's rows."""
        tensor = gguf_name(name, self.arch)
        if tensor is None:
            raise KeyError(name)
        heads = None
        if self.arch == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):
            heads = self.config.num_attention_heads
        if self.arch == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
            heads = getattr(self.config, "num_key_value_heads", None)
            heads = heads or self.config.num_attention_heads
        return tensor, None if heads is None else _hf_rows(self.gf.tensors[tensor].shape[0], heads)

    def load(self, name: str, out: torch.Tensor | None = None) -> torch.Tensor:
        """HF tensor ``name`` in fp32 (into ``out``, of its shape, when given)."""
        tensor, rows = self._tensor(name)
        w = self.gf.dequantize(tensor, out, rows)
        self.gf.release(tensor)  # read once: its pages need not stay in this process
        if self.arch in GEMMA and name.endswith("norm.weight"):
            return w.sub_(1)  # llama.cpp's converter stores Gemma's norms as the 1 + w they apply
        return w

    def row_chunks(self, name: str, rows: int) -> tuple[int, Iterator[torch.Tensor]] | None:
        """HF tensor ``name``'s row count and its fp32 rows, ``rows`` at a time, for a table
        with no row order of its own (the embedding, the lm_head); None for any other. The
        chunks share one buffer (each is overwritten by the next): a fresh one per chunk left
        glibc's heap a chunk larger each time (the default model's embedding: +60 MB of RSS)."""
        tensor, order = self._tensor(name)
        info = self.gf.tensors[tensor]
        if order is not None or len(info.shape) != 2 or name.endswith("norm.weight"):
            return None
        n = info.shape[0]

        def chunks() -> Iterator[torch.Tensor]:
            buffer = torch.empty(min(rows, n), info.shape[1])
            for a in range(0, n, rows):
                b = min(a + rows, n)
                yield self.gf.dequantize_rows(tensor, a, b, buffer[: b - a])
                self.gf.release(tensor)

        return n, chunks()

    def load_fused(self, names: tuple[str, ...]) -> torch.Tensor:
        """The tensors ``names`` concatenated along their rows, each dequantized straight into
        its rows of the result."""
        shapes = [self.gf.tensors[gguf_name(n, self.arch) or n].shape for n in names]
        out = torch.empty(sum(s[0] for s in shapes), *shapes[0][1:])
        at = 0
        for name, shape in zip(names, shapes, strict=True):
            self.load(name, out[at : at + shape[0]])
            at += shape[0]
        return out

    def load_int4(
        self, names: tuple[str, ...]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
        """The matrices ``names`` concatenated along their rows as int4 (q4, scales, zeros and
        levels) from their own blocks, when every one is stored in a type int4 holds exactly
        (Q4_0, Q4_1; IQ4_NL, IQ4_XS with their table of levels: ``engine/load/gguf_int4.py``) and
        they share their levels; else None."""
        parts = [self._tensor(n) for n in names]
        if not all(is_int4(self.gf, tensor) for tensor, _ in parts):
            return None
        if len({self.gf.tensors[tensor].type_id in IQ4_TYPES for tensor, _ in parts}) > 1:
            return None  # one matrix has one table of levels
        q4, scales, zeros = zip(*(int4_of(self.gf, t, rows) for t, rows in parts), strict=True)
        for tensor, _ in parts:  # (copied out: q4 is a reshape of wider blocks)
            self.gf.release(tensor)
        table = levels_of(self.gf.tensors[parts[0][0]].type_id)
        if len(parts) == 1:
            return q4[0], scales[0], zeros[0], table
        return torch.cat(q4), torch.cat(scales), torch.cat(zeros), table
