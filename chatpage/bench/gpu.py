"""`chatpage bench gpu`: chatpage on a GPU end to end: decode tok/s at batch 1, 32 and 128 with
CUDA graphs on and off against transformers' ``generate`` on the same GPU, and greedy equivalence
with the CPU path on the given models (``scripts/gpu_check.sh`` runs it; needs a CUDA GPU).

Decode tok/s: every request has a 128-token prompt of random ids and decodes 128 tokens with EOS
ignored; the clock starts once every prompt is prefilled (chatpage) or is the difference between
generating 128 tokens and 1 (transformers), so both sides count decode steps only. chatpage runs
bf16 weights and KV cache (its GPU default, ``dtype="auto"``), transformers bf16.
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from pathlib import Path
from typing import Any

import torch

from chatpage.bench import common
from chatpage.engine import EngineConfig, LLMEngine, SamplingParams
from chatpage.engine.load.loader import LoadedModel

BATCHES = (1, 32, 128)
PROMPT_TOKENS = 128
NEW_TOKENS = 128
SHARE = 0.5  # of the GPU for each engine (one at a time)
GOAL_VS_HF_AT_32 = 4.0


def _prompts(batch: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(PROMPT_TOKENS)] for _ in range(batch)]


def _free() -> None:
    gc.collect()
    torch.cuda.empty_cache()


def _prefilled(engine: LLMEngine) -> bool:
    sched = engine.scheduler
    return not sched.waiting and all(
        s.num_computed_tokens >= PROMPT_TOKENS for g in sched.running for s in g.seqs
    )


def chatpage_decode(loaded: LoadedModel, batch: int, graphs: bool, device: str) -> float:
    """Decode tok/s of chatpage at ``batch`` sequences."""
    engine = common.engine(
        loaded,
        device=device,
        cuda_graphs=graphs,
        max_num_seqs=batch,
        max_num_batched_tokens=max(2048, PROMPT_TOKENS),
        gpu_memory_utilization=SHARE,
    )
    vocab = engine.model.vocab_size
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    engine.generate(
        _prompts(batch, vocab, 1), SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    )  # warm, capture
    for prompt in _prompts(batch, vocab, 2):
        engine.add_request(prompt, params)
    while not _prefilled(engine):
        engine.step()
    torch.cuda.synchronize()
    t0, n0 = time.perf_counter(), engine.num_generated
    while engine.has_unfinished():
        engine.step()
    torch.cuda.synchronize()
    rate = (engine.num_generated - n0) / (time.perf_counter() - t0)
    del engine
    _free()
    return rate


def hf_decode(loaded: LoadedModel, batch: int, device: str) -> float:
    """Decode tok/s of transformers' ``generate`` (bf16, greedy) at ``batch`` sequences."""
    model = common.transformers_model(loaded.directory, loaded.gguf, torch.bfloat16).to(device)
    ids = torch.tensor(_prompts(batch, model.config.vocab_size, 2), device=device)
    mask = torch.ones_like(ids)

    def generate(n: int) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
        )
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    generate(4)  # warm-up
    prefill = generate(1)
    total = generate(NEW_TOKENS)
    return batch * (NEW_TOKENS - 1) / max(total - prefill, 1e-9)  # (the caller frees the GPU)


def greedy_equivalence(directory: Path, device: str) -> dict[str, Any]:
    """Greedy tokens of chatpage on the GPU against the CPU path on the same prompts: fp32 on
    both (expected equal) and the GPU's default bf16 (first tokens and matching prefix)."""
    prompts = [list(range(40, 95)), [5, 6, 7, 8, 9], list(range(300, 340)), [11, 12, 13]]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)

    def tokens(**config: Any) -> list[list[int]]:
        engine = LLMEngine.from_pretrained(
            str(directory), EngineConfig(**config), progress=lambda _m: None
        )
        out = [o.outputs[0].token_ids for o in engine.generate(prompts, params)]
        del engine
        _free()
        return out

    cpu = tokens(device="cpu")
    fp32 = tokens(device=device, dtype="float32", gpu_memory_utilization=SHARE)
    bf16 = tokens(device=device, dtype="auto", weight_dtype="bf16", gpu_memory_utilization=SHARE)

    def prefix(a: list[int], b: list[int]) -> int:
        return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))

    return {
        "model": directory.name,
        "fp32_equal": fp32 == cpu,
        "fp32_sequences_equal": sum(a == b for a, b in zip(fp32, cpu, strict=True)),
        "bf16_first_token_agree": sum(a[0] == b[0] for a, b in zip(bf16, cpu, strict=True)),
        "bf16_mean_matching_prefix": sum(prefix(a, b) for a, b in zip(bf16, cpu, strict=True))
        / len(prompts),
        "sequences": len(prompts),
        "tokens_each": params.max_tokens,
    }


def run(args: argparse.Namespace, device: str) -> dict[str, Any]:
    result: dict[str, Any] = {
        "device": device,
        "gpu": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "decode": [],
        "equivalence": [],
    }
    if not args.no_decode:
        loaded = common.load(args.model)
        for batch in args.batches:
            common.say(f"decode: batch {batch}")
            row = {
                "batch": batch,
                "chatpage_tok_s": round(chatpage_decode(loaded, batch, True, device), 1),
                "chatpage_no_graphs_tok_s": round(chatpage_decode(loaded, batch, False, device), 1),
                "transformers_tok_s": round(hf_decode(loaded, batch, device), 1),
            }
            _free()
            row["vs_transformers"] = round(row["chatpage_tok_s"] / row["transformers_tok_s"], 2)
            row["graphs_speedup"] = round(
                row["chatpage_tok_s"] / row["chatpage_no_graphs_tok_s"], 2
            )
            result["decode"].append(row)
        at32 = [r for r in result["decode"] if r["batch"] == 32]
        if at32:
            result["goal_vs_transformers_at_32"] = {
                "value": at32[0]["vs_transformers"],
                "target": GOAL_VS_HF_AT_32,
                "met": at32[0]["vs_transformers"] >= GOAL_VS_HF_AT_32,
            }
    for directory in args.equivalence:
        common.say(f"greedy equivalence: {directory}")
        result["equivalence"].append(greedy_equivalence(Path(directory), device))
    return result


def main(argv: list[str] | None = None) -> int:
    p = common.parser("gpu", __doc__.splitlines()[0], 1.0)
    p.set_defaults(device="cuda")
    p.add_argument(
        "--batches",
        type=lambda v: [int(b) for b in v.split(",")],
        default=list(BATCHES),
        help="decode batch sizes (default 1,32,128)",
    )
    p.add_argument(
        "--equivalence",
        action="append",
        default=[],
        metavar="DIR",
        help="an HF model directory to compare greedily with the CPU path (repeatable)",
    )
    p.add_argument("--no-decode", action="store_true", help="only the equivalence checks")
    args = common.parse(p, argv)
    device = common.DEVICE
    if not device.startswith("cuda"):
        p.error(f"bench gpu needs a CUDA device, got {device}")
    return common.emit(run(args, device), args.json)
