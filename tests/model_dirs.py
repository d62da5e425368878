"""Model directories the tests write: tiny random Llama/Qwen2 HF folders and an offline
tokenizer. No Textual here: tests/gpu (and scripts/gpu_models.py) import this on GPU machines
that have only torch, transformers and tokenizers."""

from __future__ import annotations

from pathlib import Path


def tiny_model_dir(kind: str, root: Path, tokenizer_dir: Path, **overrides) -> Path:
    """A random Llama or Qwen2 HF directory under ``root`` with the tokenizer of ``tokenizer_dir``;
    ``overrides`` change the config."""
    import torch
    from transformers import (
        AutoTokenizer,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    torch.manual_seed(0)
    common = dict(
        vocab_size=49152,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        rms_norm_eps=1e-5,
    )
    common.update(overrides)
    if kind == "llama":
        config = LlamaConfig(tie_word_embeddings=False, **common)
        model = LlamaForCausalLM(config)
    else:
        config = Qwen2Config(tie_word_embeddings=False, use_sliding_window=False, **common)
        model = Qwen2ForCausalLM(config)
        with torch.no_grad():  # random, non-zero qkv biases so the bias path is exercised
            for layer in model.model.layers:
                for proj in (
                    layer.self_attn.q_proj,
                    layer.self_attn.k_proj,
                    layer.self_attn.v_proj,
                ):
                    proj.bias.normal_(0, 0.5)
    # Untied, with a wider lm_head than the default init: logits spread enough that greedy choices
    # are not near-ties, yet no token is certain (a tied random model just repeats its input,
    # which makes beam search degenerate). The default model covers tied embeddings.
    with torch.no_grad():
        model.lm_head.weight.normal_(0, 0.2)
    out = root / kind
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out)
    return out


def offline_tokenizer_dir(root: Path) -> Path:
    """A small byte-level BPE tokenizer (about 300 tokens, <s> and </s> as ids 1 and 2) trained
    here on a few sentences: for machines without the default model and no network (a GPU box).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    text = [
        "The capital of France is Paris.",
        "Hello, how are you today?",
        "Paged attention keeps the KV cache in blocks.",
    ]
    tok.train_from_iterator(text * 20, trainer)
    out = root / "offline-tokenizer"
    PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    ).save_pretrained(out)
    return out


def reference_model(model_dir: Path):
    """transformers' model of ``model_dir`` in fp32, in eval mode: what the engine is checked
    against."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
