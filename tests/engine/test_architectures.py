"""The architectures beyond Llama: each layer's sliding window read from the config
(``layer_windows``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from chatpage.engine.model.model_config import layer_windows


def _config(name: str, **kw):
    import transformers

    return getattr(transformers, name)(num_hidden_layers=6, **kw)


@pytest.mark.parametrize(
    ("name", "kw", "want"),
    [
        ("LlamaConfig", {}, [0] * 6),
        ("MistralConfig", {"sliding_window": 24}, [24] * 6),
        ("MistralConfig", {"sliding_window": None}, [0] * 6),
        ("Phi3Config", {"sliding_window": 40}, [40] * 6),
        ("Gemma2Config", {"sliding_window": 16}, [16, 0] * 3),
        ("Gemma3TextConfig", {"sliding_window": 16}, [16] * 5 + [0]),
        ("Gemma3TextConfig", {"sliding_window": 16, "sliding_window_pattern": 3}, [16, 16, 0] * 2),
        ("Qwen2Config", {"sliding_window": 32}, [0] * 6),  # use_sliding_window is off by default
        (
            "Qwen2Config",
            {"sliding_window": 32, "use_sliding_window": True, "max_window_layers": 4},
            [0] * 4 + [32] * 2,
        ),
        ("Qwen3Config", {"sliding_window": 32, "use_sliding_window": False}, [0] * 6),
        (
            "SmolLM3Config",
            {"sliding_window": 8, "use_sliding_window": True, "no_rope_layer_interval": 3},
            [0, 0, 8, 0, 0, 8],
        ),
    ],
)
def test_layer_windows_from_transformers_configs(name, kw, want):
    assert layer_windows(_config(name, **kw)) == want


class _Raw:
    """A config as its config.json spells it, without transformers' derived ``layer_types``."""

    def __init__(self, **kw) -> None:
        self.num_hidden_layers = 6
        self.__dict__.update(kw)


@pytest.mark.parametrize(
    ("kw", "want"),
    [
        ({"model_type": "gemma2", "sliding_window": 10}, [10, 0] * 3),
        ({"sliding_window": 10, "sliding_window_pattern": 6}, [10] * 5 + [0]),
        ({"sliding_window": 10, "use_sliding_window": False}, [0] * 6),
        (
            {"sliding_window": 10, "use_sliding_window": True, "max_window_layers": 2},
            [0, 0] + [10] * 4,
        ),
        ({"sliding_window": 10}, [10] * 6),
        ({"sliding_window": 0}, [0] * 6),
    ],
)
def test_layer_windows_from_older_spellings(kw, want):
    assert layer_windows(_Raw(**kw)) == want


def test_bad_layer_types_are_named():
    with pytest.raises(ValueError, match="layer_types has 2 entries for 6 layers"):
        layer_windows(_Raw(sliding_window=4, layer_types=["full_attention"] * 2))
    with pytest.raises(ValueError, match="unsupported layer type 'chunked_attention'"):
        layer_windows(_Raw(sliding_window=4, layer_types=["chunked_attention"] * 6))


# -- each architecture against transformers -------------------------------------------------------
COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
    tie_word_embeddings=False,
)
ARCHITECTURES = {
    "llama3": (
        "LlamaConfig",
        {
            "num_hidden_layers": 2,
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        },
    ),
    "qwen2.5": (  # QKV bias, sliding windows from max_window_layers on
        "Qwen2Config",
        {
            "num_hidden_layers": 3,
            "use_sliding_window": True,
            "sliding_window": 12,
            "max_window_layers": 1,
        },
    ),
    "qwen3": ("Qwen3Config", {"num_hidden_layers": 2, "attention_bias": False}),
    "mistral": ("MistralConfig", {"num_hidden_layers": 2, "sliding_window": 11}),
    "ministral": (
        "MinistralConfig",
        {
            "num_hidden_layers": 2,
            "sliding_window": 9,
            "layer_types": ["sliding_attention", "full_attention"],
        },
    ),
    "gemma2": (
        "Gemma2Config",
        {
            "num_hidden_layers": 4,
            "sliding_window": 10,
            "query_pre_attn_scalar": 24,
            "attn_logit_softcapping": 1.5,
            "final_logit_softcapping": 4.0,
        },
    ),
    "gemma3": (  # 5 sliding layers : 1 full, the local RoPE base on the sliding ones
        "Gemma3TextConfig",
        {
            "num_hidden_layers": 6,
            "sliding_window": 10,
            "query_pre_attn_scalar": 24,
            "rope_theta": 10000.0,
            "rope_local_base_freq": 100.0,
        },
    ),
    "phi3": (  # fused qkv_proj and gate_up_proj, half the head rotated, LongRoPE's short factors
        "Phi3Config",
        {
            "num_hidden_layers": 2,
            "sliding_window": 20,
            "partial_rotary_factor": 0.5,
            "original_max_position_embeddings": 64,
            "rope_parameters": {
                "rope_type": "longrope",
                "short_factor": [1.0, 1.3, 1.7, 2.5],
                "long_factor": [3.0] * 4,
                "factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
    ),
    "smollm3": ("SmolLM3Config", {"num_hidden_layers": 4}),  # no RoPE on layer 3
}
BLOCK = 8
MAX_NEW = 8
PROMPT_LENS = (3, 19, 37)


def _tiny_dir(kind: str, root, tokenizer_dir, **changes):
    """A random model of ``kind`` (its norms, biases and lm_head spread out so that every option
    changes the output; ``changes`` to its config) saved with the offline tokenizer; the model
    for transformers' side."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name, overrides = ARCHITECTURES[kind]
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = _config_of(name, vocab_size=len(tokenizer), **{**COMMON, **overrides, **changes})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.normal_(0.0, 0.3).add_(0.0 if kind.startswith("gemma") else 1.0)
            elif pname.endswith("bias"):
                p.normal_(0.0, 0.5)
            elif pname.endswith(("q_proj.weight", "k_proj.weight", "qkv_proj.weight")):
                p.normal_(0.0, 0.25)  # peaked attention: windows, RoPE and soft-caps show
        if not config.tie_word_embeddings:
            model.lm_head.weight.normal_(0.0, 0.3)
    out = root / kind
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out, model


def _config_of(name: str, **kw):
    import transformers

    return getattr(transformers, name)(**kw)


def _hf_greedy(model, prompt: list[int]) -> tuple[list[int], list[float]]:
    """transformers' greedy continuation of ``prompt`` and each token's logprob."""
    import torch

    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=MAX_NEW,
            do_sample=False,
            pad_token_id=2,
            output_scores=True,
            return_dict_in_generate=True,
        )
    tokens = out.sequences[0, len(prompt) :].tolist()
    logprobs = [float(s[0].log_softmax(-1)[t]) for s, t in zip(out.scores, tokens, strict=True)]
    return tokens, logprobs


def _assert_same(outputs, theirs) -> None:
    """The same tokens, with the same logprobs (the final soft-cap shows only in those)."""
    assert [o.outputs[0].token_ids for o in outputs] == [t for t, _ in theirs]
    for out, (_, logprobs) in zip(outputs, theirs, strict=True):
        assert out.outputs[0].logprobs == pytest.approx(logprobs, abs=1e-4)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from model_dirs import offline_tokenizer_dir

    return offline_tokenizer_dir(tmp_path_factory.mktemp("tok"))


@pytest.mark.parametrize("kind", list(ARCHITECTURES))
def test_greedy_output_equals_transformers(kind, tokenizer_dir, tmp_path):
    """Prompts longer than the windows, a second turn over the cached prefix, and all of them
    again in a pool too small for them at once (preempted and recomputed)."""
    import random

    from chatpage.engine import EngineConfig, LLMEngine, SamplingParams

    path, hf = _tiny_dir(kind, tmp_path, tokenizer_dir)
    rng = random.Random(1)
    vocab = hf.config.vocab_size
    prompts = [[rng.randrange(3, vocab) for _ in range(n)] for n in PROMPT_LENS]
    theirs = [_hf_greedy(hf, p) for p in prompts]
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=0)

    engine = LLMEngine.from_pretrained(
        str(path), EngineConfig(block_size=BLOCK, kv_cache_bytes=4 << 20), progress=lambda _m: None
    )
    ours = engine.generate(prompts, params)
    _assert_same(ours, theirs)
    # a second turn: the first turn's blocks are a prefix hit
    turn2 = prompts[2] + ours[2].outputs[0].token_ids + [rng.randrange(3, vocab) for _ in range(5)]
    again = engine.generate([turn2], params)[0]
    assert again.usage.cached_tokens >= 5 * BLOCK
    _assert_same([again], [_hf_greedy(hf, turn2)])

    m = engine.model
    block_bytes = 2 * m.num_layers * BLOCK * m.num_kv_heads * m.head_dim * 4
    small = LLMEngine.from_pretrained(
        str(path),
        EngineConfig(
            block_size=BLOCK,
            kv_cache_bytes=10 * block_bytes,  # all three prompts start, then outgrow it
            preemption_mode="recompute",
            enable_prefix_caching=False,
            free_outside_window=False,  # (freeing too: tests/engine/test_sliding_engine.py)
        ),
        progress=lambda _m: None,
    )
    # a block is a page of page_layers layers (KV groups by window): 10 blocks of every layer
    assert small.bm.pool.num_blocks * m.kv_groups.page_layers == 10 * m.num_layers
    squeezed = small.generate(prompts, params)
    assert small.stats().preemptions_recompute > 0
    _assert_same(squeezed, theirs)


# -- the same models as GGUF files, written as llama.cpp's converter writes them ----------------
# (Phi-3: the file's LongRoPE factors run as transformers runs them, the short ones below the
# original context; llama.cpp picks one set for the whole context, so its tokens differ there)
# (Mistral and Ministral files are llama files, their window and which layers slide in metadata)
GGUF_ARCH = {
    "qwen3": "QWEN3",
    "gemma2": "GEMMA2",
    "gemma3": "GEMMA3",
    "mistral": "LLAMA",
    "ministral": "LLAMA",
    "phi3": "PHI3",
}


def _llama_cpp_order(w, heads: int):
    """llama.cpp's converter's Q/K row order for its llama files (each head's rotary halves
    interleaved)."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def _write_gguf(
    kind: str, hf, path, tokenizer, add_bos: bool | None = None, chat_template: str | None = None
) -> None:
    """``hf`` as a GGUF of F32 tensors: names from gguf-py's tensor map (llama.cpp's), Gemma's
    norms stored as 1 + w, the metadata keys llama.cpp's converter writes for ``kind``; the
    vocabulary of ``tokenizer`` (byte-level BPE), with the converter's BOS flag ``add_bos`` and
    ``chat_template`` where given."""
    import gguf

    c = hf.config
    arch = gguf.MODEL_ARCH[GGUF_ARCH[kind]]
    w = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_key_length(COMMON["head_dim"])
    w.add_value_length(COMMON["head_dim"])
    rope = c.rope_parameters.get("full_attention", c.rope_parameters)
    w.add_rope_freq_base(rope["rope_theta"])
    if getattr(c, "sliding_window", None):
        w.add_sliding_window(c.sliding_window)
    if kind == "ministral":
        w.add_sliding_window_pattern([t == "sliding_attention" for t in c.layer_types])
    if kind == "phi3":  # what llama.cpp's converter writes for LongRoPE
        import math

        rope_dim = int(COMMON["head_dim"] * c.partial_rotary_factor)
        orig = c.rope_parameters["original_max_position_embeddings"]
        w.add_rope_dimension_count(rope_dim)
        w.add_rope_scaling_orig_ctx_len(orig)
        scale = c.max_position_embeddings / orig
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(orig)))
        for which in ("long", "short"):
            factors = np.array(c.rope_parameters[f"{which}_factor"], dtype=np.float32)
            w.add_tensor(f"rope_factors_{which}.weight", factors)
    if kind == "gemma2":
        w.add_attn_logit_softcapping(c.attn_logit_softcapping)
        w.add_final_logit_softcapping(c.final_logit_softcapping)
    if kind == "gemma3":
        w.add_rope_freq_base_swa(c.rope_parameters["sliding_attention"]["rope_theta"])
    vocab = tokenizer.backend_tokenizer.get_vocab()
    w.add_tokenizer_model("gpt2")
    w.add_token_list(sorted(vocab, key=vocab.get))
    w.add_token_types([1] * len(vocab))
    w.add_token_scores([0.0] * len(vocab))
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_eos_token_id(2)
    if add_bos is not None:
        w.add_bos_token_id(1)
        w.add_add_bos_token(add_bos)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    names = gguf.get_tensor_name_map(arch, c.num_hidden_layers)
    for name, t in hf.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        data = t.float().numpy()
        if kind.startswith("gemma") and name.endswith("norm.weight"):
            data = data + 1
        if GGUF_ARCH[kind] == "LLAMA" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = c.num_attention_heads if "q_proj" in name else c.num_key_value_heads
            data = _llama_cpp_order(data, heads)
        w.add_tensor(names.get_name(name, try_suffixes=(".weight", ".bias")), data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.slow  # transformers' reference beside ours
@pytest.mark.parametrize("kind", list(GGUF_ARCH))
def test_gguf_files_run_as_transformers_does(kind, tokenizer_dir, tmp_path):
    import random

    from transformers import AutoTokenizer

    from chatpage.engine import EngineConfig, LLMEngine, SamplingParams

    # Gemma files: tied embeddings, and the query scale llama.cpp assumes below 27B (head_dim)
    gemma = {"tie_word_embeddings": True, "query_pre_attn_scalar": COMMON["head_dim"]}
    _, hf = _tiny_dir(kind, tmp_path, tokenizer_dir, **(gemma if kind.startswith("gemma") else {}))
    path = tmp_path / f"{kind}.gguf"
    _write_gguf(kind, hf, path, AutoTokenizer.from_pretrained(tokenizer_dir))
    rng = random.Random(2)
    prompts = [[rng.randrange(3, hf.config.vocab_size) for _ in range(n)] for n in PROMPT_LENS]
    engine = LLMEngine.from_pretrained(
        str(path), EngineConfig(block_size=BLOCK, kv_cache_bytes=4 << 20), progress=lambda _m: None
    )
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=0)
    _assert_same(engine.generate(prompts, params), [_hf_greedy(hf, p) for p in prompts])
