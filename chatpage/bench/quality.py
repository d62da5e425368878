"""`chatpage bench quality`: what each weight format costs in quality, against fp32.

For every format (``engine/model/weights.py``): the perplexity of the model on a fixed English text
shipped in the repo (``bench/data/quality.txt``, ~1,000 tokens, scored in one pass), its relative
change against fp32, and greedy agreement over 256 tokens: fp32 writes a greedy continuation of a
fixed chat prompt (EOS ignored); ``greedy_agreement`` is the fraction of those positions where the
format's own top-1 token, given the same prefix, is fp32's, and ``greedy_prefix_tokens`` how many
tokens the format's free-running greedy output shares with fp32's from the start.

Where llama-cpp-python is installed and the model is a GGUF, llama.cpp's perplexity on the same
file and the same token ids (``logits_all``) is measured in the same run, and each format's
perplexity is also given against it: goal <= +1% for the file's own precision (:func:`own_format`).
``--files`` does that comparison (perplexity only) for more GGUF files: ``requant`` names the
default model and its re-quantizations by llama.cpp (``bench/requant.py``, made on first use),
``bos`` the default model with a tokenizer that adds a BOS. Each comparison says whether our ids
of the text start with a BOS (``bos_added``), whether llama.cpp's own tokenization of it does and
whether that gives our ids.

Each format of a GGUF is measured as the app loads it (its pack). The loader reads every GGUF
tensor type dequantized bit-exactly to fp32 (``engine/load/dequant.py``), then re-encoded in the weight
format asked for (int4: groups of 32 with a bf16 scale and zero, the lm_head in int8; int8:
per-row scales; bf16; fp32), except that int4 keeps a Q4_0, Q4_1, IQ4_NL or IQ4_XS matrix's own
blocks (their nibbles, the IQ4 types' table of levels, scales rounded to bf16:
``engine/load/gguf_int4.py``). The app's default is int4 whatever the
file holds.

Each format's ``kv_int8`` is what an int8 KV cache costs it, the llama.cpp way: the text's
logits over an int8 cache against a bf16 one (mean KL divergence, perplexity change, top-1
agreement; goals: KLD <= 0.005 and perplexity within +0.5%).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from chatpage.bench import common, llamacpp, requant
from chatpage.bench.reporting import Goal, Section, reader, table
from chatpage.engine import LLMEngine, SamplingParams
from chatpage.engine.load.loader import LoadedModel, load_model
from chatpage.engine.model import kv_check
from chatpage.engine.model.llama import AttentionMetadata
from chatpage.engine.text.chat_template import render_prompt
from chatpage.vocab import WEIGHT_FORMATS

TEXT = Path(__file__).resolve().parent / "data" / "quality.txt"
GREEDY_TOKENS = 256
PROMPT = "Explain, step by step, how a bridge is built across a wide river."
# Goals of issue 11 on the perplexity change against fp32.
GOAL_PPL_DELTA = {"bf16": 0.02, "int8": 0.02, "int4": 0.06}
# Issue 21's goal on the perplexity change against llama.cpp on the same file, own precision.
GOAL_VS_LLAMACPP = 0.01
MISSING = "llama_cpp is not importable (`make bench-peers` installs llama-cpp-python)"
# The chatpage format that holds a GGUF tensor type's bits (the fewest bits at or above its own)
OWN_FORMATS = {
    "F32": "fp32",
    "F16": "bf16",
    "BF16": "bf16",
    "Q8_0": "int8",
    "Q6_K": "int8",
    "Q5_0": "int8",
    "Q5_1": "int8",
    "Q5_K": "int8",
}


@torch.inference_mode()
def all_logits(eng: LLMEngine, ids: list[int]) -> torch.Tensor:
    """Logits [len(ids), vocab] of every position of ``ids`` run as one fresh sequence on ``eng``'s
    model, over the first blocks of its (otherwise idle) KV pool."""
    n, bs = len(ids), eng.config.block_size
    blocks = math.ceil(n / bs)
    if blocks > eng.kv.k[0].shape[0]:
        raise ValueError(f"{n} tokens need {blocks} KV blocks; the pool has {eng.kv.k[0].shape[0]}")
    meta = AttentionMetadata(
        slot_mapping=torch.arange(n),
        block_tables=torch.arange(blocks, dtype=torch.int32).unsqueeze(0),
        seq_lens=torch.tensor([n], dtype=torch.int32),
        query_start_loc=torch.tensor([0, n], dtype=torch.int32),
    )
    return eng.model.forward(
        torch.tensor(ids), torch.arange(n), meta, eng.kv.k, eng.kv.v, torch.arange(n)
    )


def format_engine(loaded: LoadedModel, fmt: str) -> LLMEngine:
    """An engine in ``fmt`` with the weights the app would run: a GGUF file loaded in that
    format (its pack, where a Q4_0 / Q4_1 / IQ4_NL / IQ4_XS file's int4 keeps the file's own
    blocks), anything else packed from the loaded state."""
    if loaded.gguf is not None and fmt != loaded.weights:
        loaded = load_model(loaded.gguf, progress=common.say, weights=fmt)
    return common.engine(loaded, weight_dtype=fmt)


def perplexity(logits: torch.Tensor, ids: list[int]) -> float:
    """exp of the mean negative log-likelihood of ``ids[1:]`` under ``logits[:-1]``."""
    return math.exp(F.cross_entropy(logits[:-1], torch.tensor(ids[1:])).item())


def greedy(eng: LLMEngine, prompt: list[int], tokens: int) -> list[int]:
    """``tokens`` greedy tokens after ``prompt`` (EOS ignored)."""
    rid = eng.add_request(
        prompt, SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    )
    ids: list[int] = []
    while eng.has_unfinished():
        for update in eng.step():
            if update.request_id == rid:  # (a prompt chunk's update brings no output)
                ids += (t for out in update.outputs for t in out.token_ids)
    return ids


def kv_int8(eng: LLMEngine, text_ids: list[int]) -> dict:
    """An int8 KV cache against bf16 KV on the text, ``eng``'s weights
    (``engine/model/kv_check.py``): mean KL divergence, perplexities, top-1 agreement, and the
    goals (mean KLD <= 0.005, perplexity within +0.5%)."""
    loss = kv_check.int8_loss(eng.model, text_ids, eng.config.block_size, torch.bfloat16)
    return {
        "kld": loss.kld,
        "bf16_kv_perplexity": loss.base_perplexity,
        "perplexity": loss.perplexity,
        "perplexity_delta": loss.perplexity_change,
        "top1_agreement": loss.top1,
        "met": loss.acceptable and loss.perplexity_change <= kv_check.MAX_PPL_CHANGE,
    }


def evaluate(eng: LLMEngine, text_ids: list[int], prompt: list[int], reference: list[int]) -> dict:
    """Perplexity on the text and agreement with fp32's greedy ``reference`` after ``prompt``;
    what an int8 KV cache costs these weights (:func:`kv_int8`)."""
    ppl = perplexity(all_logits(eng, text_ids), text_ids)
    forced = all_logits(eng, prompt + reference)[len(prompt) - 1 : -1].argmax(-1)
    agreement = (forced == torch.tensor(reference)).float().mean().item()
    own = greedy(eng, prompt, len(reference))
    same = next(
        (i for i, (a, b) in enumerate(zip(own, reference, strict=True)) if a != b), len(reference)
    )
    return {
        "perplexity": ppl,
        "greedy_agreement": agreement,
        "greedy_prefix_tokens": same,
        "weight_bytes": eng.model.weight_bytes,
        "kv_int8": kv_int8(eng, text_ids),
    }


def matrix_types(gguf: Path) -> dict[str, int]:
    """Bytes of the file's weight matrices (2-D tensors) by tensor type, largest first."""
    from chatpage.engine.load.gguf_file import GGUFFile

    out: dict[str, int] = {}
    for t in GGUFFile(gguf).tensors.values():
        if len(t.shape) == 2:
            out[t.type_name] = out.get(t.type_name, 0) + t.nbytes
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def own_format(types: dict[str, int]) -> str:
    """The file's own precision as a chatpage format: that of the type holding most of its matrix
    bytes (:data:`OWN_FORMATS`; 4 bits and fewer: int4)."""
    return OWN_FORMATS.get(next(iter(types)), "int4")


def quality_ids(loaded) -> list[int]:
    """The quality text's ids as a user's text prompt gets them: with the special tokens the
    model's tokenizer puts around a text (a BOS, which llama.cpp adds too where the file asks)."""
    return loaded.tokenizer.encode(TEXT.read_text(encoding="utf-8"), add_special_tokens=True)


def bos_added(loaded, ids: list[int]) -> bool:
    """Whether the text's ids start with the model's BOS."""
    bos = getattr(loaded.tokenizer, "bos_token_id", None)
    return bos is not None and bool(ids) and ids[0] == bos


def against_llamacpp(gguf: Path, ids: list[int], perplexities: dict[str, float]) -> dict:
    """llama.cpp's perplexity on ``gguf`` and ``ids`` beside ours (format -> perplexity)."""
    common.say(f"quality: llama.cpp on {gguf.name}")
    theirs = llamacpp.perplexity(gguf, ids)
    their_ids, their_bos = llamacpp.text_ids(gguf, TEXT.read_text(encoding="utf-8"))
    types = matrix_types(gguf)
    own = own_format(types)
    delta = {f: p / theirs - 1 for f, p in perplexities.items()}
    return {
        "file": gguf.name,
        "file_bytes": gguf.stat().st_size,
        "matrix_types": types,
        # llama.cpp's own tokenization of the text: its BOS, and whether it is ours id for id
        # (the perplexities are both of ours)
        "llamacpp_bos_added": their_bos,
        "same_ids_as_llamacpp": their_ids == ids,
        "llamacpp_perplexity": theirs,
        "perplexity": perplexities,
        "delta_vs_llamacpp": delta,
        "own_format": own,
        "goal_delta_vs_llamacpp": GOAL_VS_LLAMACPP,
        "met": delta[own] <= GOAL_VS_LLAMACPP if own in delta else None,
    }


def compare_file(gguf: Path, formats: list[str]) -> dict:
    """Our perplexity on ``gguf`` in fp32 and each of ``formats``, against llama.cpp's."""
    loaded = common.load(str(gguf))
    ids = quality_ids(loaded)
    ours = {}
    for fmt in ["fp32"] + [f for f in formats if f != "fp32"]:
        common.say(f"quality: {gguf.name} in {fmt}")
        eng = format_engine(loaded, fmt)
        ours[fmt] = perplexity(all_logits(eng, ids), ids)
        del eng
    return {"bos_added": bos_added(loaded, ids), **against_llamacpp(gguf, ids, ours)}


def run(args) -> dict:
    loaded = common.load(args.model)
    ids = quality_ids(loaded)
    prompt = render_prompt(loaded.tokenizer, [{"role": "user", "content": PROMPT}])
    formats = [f for f in WEIGHT_FORMATS if f in args.weights]
    rows, reference, base = [], None, None
    for fmt in ["fp32"] + [f for f in formats if f != "fp32"]:
        common.say(f"quality: {fmt}")
        eng = format_engine(loaded, fmt)
        if reference is None:
            reference = greedy(eng, prompt, GREEDY_TOKENS)
        row = {"weights": fmt, **evaluate(eng, ids, prompt, reference)}
        base = base or row["perplexity"]
        row["perplexity_delta"] = row["perplexity"] / base - 1
        goal = GOAL_PPL_DELTA.get(fmt)
        row["goal_perplexity_delta"] = goal
        row["met"] = None if goal is None else row["perplexity_delta"] <= goal
        rows.append(row)
    out = {
        "benchmark": "quality",
        **common.model_info(loaded),
        "text": TEXT.name,
        "text_tokens": len(ids),
        "bos_added": bos_added(loaded, ids),
        "greedy_tokens": GREEDY_TOKENS,
        "formats": rows,
    }
    if not llamacpp.available():  # --files too compare with llama.cpp
        out["llamacpp_error"] = MISSING
        return out
    if loaded.gguf is not None:
        out["llamacpp"] = {
            "bos_added": out["bos_added"],
            **against_llamacpp(loaded.gguf, ids, {r["weights"]: r["perplexity"] for r in rows}),
        }
    done = {loaded.gguf.resolve()} if loaded.gguf is not None else set()
    files = [f for f in requant.named_files(args.files) if f.resolve() not in done]
    out["files"] = [compare_file(f, formats) for f in files]
    return out


def main(argv: list[str] | None = None) -> int:
    p = common.parser("quality", __doc__.splitlines()[0], default_scale=1.0)
    p.add_argument(
        "--weights",
        type=common.weight_formats,
        default=list(WEIGHT_FORMATS),
        help="comma-separated formats to compare with fp32 (default: all)",
    )
    p.add_argument(
        "--files",
        default="",
        help="more GGUF files to compare with llama.cpp, comma-separated: " + requant.NAMES_HELP,
    )
    args = common.parse(p, argv)
    return common.emit(common.round_floats(run(args)), args.json)


# -- the report ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class FormatQuality:
    """One weight format against fp32, judged in the run (its goal as the run recorded it)."""

    weights: str
    perplexity: float
    perplexity_delta: float
    greedy_agreement: float
    greedy_prefix_tokens: int
    weight_bytes: int
    goal_perplexity_delta: float | None
    met: bool | None
    kv_int8: dict | None = None  # int8 KV against bf16 KV (runs before issue 44 did not record it)


@dataclass(frozen=True)
class FileVsLlamaCpp:
    """One GGUF file: our perplexity in each format against llama.cpp's (:func:`against_llamacpp`)."""

    file: str
    matrix_types: dict[str, int]
    llamacpp_perplexity: float
    perplexity: dict[str, float]
    delta_vs_llamacpp: dict[str, float]
    own_format: str
    goal_delta_vs_llamacpp: float
    met: bool | None
    # whether the text's ids start with a BOS, ours and in llama.cpp's own tokenization, and
    # whether the two tokenizations agree (runs before issue 39 did not record them)
    bos_added: bool | None = None
    llamacpp_bos_added: bool | None = None
    same_ids_as_llamacpp: bool | None = None

    @property
    def bos(self) -> str:
        """``yes / yes``: whether our ids and llama.cpp's start with a BOS ("-" where not recorded)."""
        if self.bos_added is None or self.llamacpp_bos_added is None:
            return "-"
        said = {True: "yes", False: "no"}
        same = "" if self.same_ids_as_llamacpp else " (ids differ)"
        return f"{said[self.bos_added]} / {said[self.llamacpp_bos_added]}{same}"

    @property
    def types(self) -> str:
        """``Q4_1 80%, Q8_0 20%``: the file's matrix bytes by tensor type."""
        total = sum(self.matrix_types.values())
        return ", ".join(f"{t} {b / total:.0%}" for t, b in self.matrix_types.items())


@dataclass(frozen=True)
class QualityResult:
    """What the report reads of a run's JSON; the llama.cpp files where it ran."""

    text: str
    text_tokens: int
    greedy_tokens: int
    formats: list[FormatQuality]
    llamacpp: FileVsLlamaCpp | None = None
    files: list[FileVsLlamaCpp] = field(default_factory=list)
    llamacpp_error: str | None = None

    @property
    def compared(self) -> list[FileVsLlamaCpp]:
        """Every file compared with llama.cpp, the run's own model first."""
        return ([self.llamacpp] if self.llamacpp is not None else []) + self.files


def goals(q: QualityResult) -> list[Goal]:
    rows = [
        Goal(
            "quality",
            f"{r.weights} perplexity vs fp32",
            r.perplexity_delta,
            f"<= {r.goal_perplexity_delta:.0%}",
            r.met,
            f"perplexity {r.perplexity:.2f} against {q.formats[0].perplexity:.2f} "
            f"on {q.text_tokens} tokens; top-1 agreement with fp32's greedy text "
            f"{r.greedy_agreement:.3f} over {q.greedy_tokens} tokens",
        )
        for r in q.formats
        if r.goal_perplexity_delta is not None
    ]
    rows += [
        Goal(
            "quality",
            f"int8 KV vs bf16 KV, {r.weights} weights: mean KLD",
            r.kv_int8["kld"],
            f"<= {kv_check.MAX_KLD}",
            r.kv_int8["met"],
            f"perplexity {r.kv_int8['perplexity_delta']:+.2%} (goal <= "
            f"+{kv_check.MAX_PPL_CHANGE:.1%}), top-1 agreement "
            f"{r.kv_int8['top1_agreement']:.3f} on {q.text_tokens} tokens",
        )
        for r in q.formats
        if r.kv_int8 is not None
    ]
    for f in q.compared:
        own = f.own_format
        rows.append(
            Goal(
                "quality",
                f"{own} perplexity vs llama.cpp, {f.file}",
                f.delta_vs_llamacpp[own],
                f"<= +{f.goal_delta_vs_llamacpp:.0%}",
                f.met,
                f"{f.perplexity[own]:.2f} against llama.cpp's {f.llamacpp_perplexity:.2f}; "
                f"{own} is the file's own precision ({f.types})",
            )
        )
    return rows


def figures(r: QualityResult) -> list[str]:
    rows = [
        [
            x.weights,
            x.perplexity,
            100 * x.perplexity_delta,
            x.greedy_agreement,
            x.greedy_prefix_tokens,
            x.weight_bytes / 1e6,
        ]
        for x in r.formats
    ]
    header = ["weights", "perplexity", "change (%)", "top-1 agreement"]
    out = [
        f"Perplexity on `chatpage/bench/data/{r.text}` ({r.text_tokens} tokens); "
        f"agreement with fp32's {r.greedy_tokens} greedy tokens.",
        "",
        table([*header, "identical prefix (tokens)", "weights read (MB)"], rows),
    ]
    vs = _llamacpp_figures(r)
    return out + ([""] + vs if vs else [])


def _llamacpp_figures(r: QualityResult) -> list[str]:
    files = r.compared
    if not files:
        return [f"Not compared with llama.cpp: {r.llamacpp_error}"] if r.llamacpp_error else []
    formats = list(files[0].perplexity)
    rows = [
        [
            f.file,
            f.types,
            f.bos,
            f.llamacpp_perplexity,
            *(100 * f.delta_vs_llamacpp[w] for w in formats),
            f.own_format,
            "met" if f.met else "**missed**",
        ]
        for f in files
    ]
    return [
        "Against llama.cpp (llama-cpp-python, `logits_all`, the same token ids) on the same "
        "file; the re-quantized files made by llama.cpp's quantizer from an F16 copy of the "
        "default model (itself Q4_1, so each is a re-quantization of Q4_1 values). Own "
        f"precision: the format of the type holding most matrix bytes (goal <= "
        f"+{GOAL_VS_LLAMACPP:.0%}).",
        "",
        table(
            [
                "file",
                "matrix bytes by type",
                "BOS (ours / llama.cpp)",
                "llama.cpp perplexity",
                *(f"{w} vs llama.cpp (%)" for w in formats),
                "own precision",
                "goal",
            ],
            rows,
        ),
    ]


# against llama.cpp on the default model's re-quantizations too (bench/requant.py; where
# llama-cpp-python is missing it says so)
SECTION = Section(reader(QualityResult), goals, figures, args=("--files", "requant"))


if __name__ == "__main__":
    raise SystemExit(main())
