"""Offline throughput: chatpage against transformers' ``generate`` on the same requests, plus a
roofline of chatpage's decode step.

Both systems get the same model (fp32), the same threads and the same ShareGPT-shaped trace (all
requests available at once, each decoding exactly its output length with EOS ignored):

* chatpage: every request added up front; continuous batching does the rest.
* transformers: static batches in arrival order, left padded; a batch decodes until its longest
  request is done, so only each request's own output tokens count as useful. The batch size is
  transformers' best of ``--hf-batches``: the first candidate runs the whole trace, each further
  one is abandoned once its time passes the best so far, or, after a quarter of the work, once
  its linear projection is worse.

Roofline fields (measured in the same run): ``gemm_bound_tok_s`` is the rate of the model's
matmuls alone (fused qkv, o, gate_up, down per layer, plus the lm_head for every row) at batch
128; ``fraction_of_gemm_bound`` is chatpage's decode rate with 128 concurrent sequences over it.
``weight_read_floor_ms`` is the weight bytes over the memory read bandwidth the run's threads
reach (reducing a large tensor: sum or max, the faster); ``batch1_floor_ratio`` is chatpage's
batch-1 decode step over that floor; ``batch1_gemm_ms`` is the step's matmuls alone (the rate at
which they read the weights is ``batch1_gemm_read_gb_s``).

``--peer llamacpp`` adds llama.cpp (llama-cpp-python, when importable) on the same GGUF, serial
and batched; see chatpage/bench/llamacpp.py.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import torch

from chatpage.bench import common, plots
from chatpage.bench.reporting import Goal, Section, at_least, at_most, from_json, table
from chatpage.bench.workloads import SHAREGPT, BenchRequest, describe, make_trace
from chatpage.engine import SamplingParams
from chatpage.engine.load.loader import default_model_path
from chatpage.vocab import DEFAULT_WEIGHTS

T = TypeVar("T")

DEFAULT_SCALE = 0.25
REQUESTS_AT_SCALE_1 = 192  # 48 requests at the default scale
HF_BATCHES = (48, 16, 8)  # the first runs in full; order the likely best first
ROOFLINE_BATCH = 128
ABANDON_MARGIN = 1.0  # a candidate projected this much slower than the best is stopped...
PROJECT_AFTER = 0.25  # ...once this share of the useful tokens is done (or past the best time)
GOAL_RATIO = 8.0  # chatpage / transformers useful tok/s, fp32 (and in the best weight format)
GOAL_DEFAULT_RATIO = 12.0  # the same in the app's default weight format
GOAL_FRACTION_OF_GEMM_BOUND = 0.75  # the roofline decode's rate over its matmuls' alone
GOAL_BATCH1_FLOOR_RATIO = 1.3  # the batch-1 step over the weight-read floor


# -- chatpage ----------------------------------------------------------------------------------
def _warm_up(eng) -> None:
    """Load the kernels and touch every code path once, outside any timing."""
    eng.generate(
        [list(range(100, 140))], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    )


def run_chatpage(eng, trace: list[BenchRequest]) -> dict:
    """All of ``trace`` at once through ``eng``; wall time and batch sizes."""
    log = common.record_batches(eng)
    start = len(log)
    t0 = common.now()
    for r in trace:
        eng.add_request(
            r.prompt_ids, SamplingParams(temperature=0, max_tokens=r.output_len, ignore_eos=True)
        )
    common.drain(eng)
    elapsed = common.now() - t0
    batches = [n for n, _ in log[start:]]
    return {"seconds": elapsed, "mean_batch": statistics.fmean(batches), "steps": len(batches)}


def decode_step_ms(eng, concurrency: int, prompt_len: int, new_tokens: int) -> float:
    """Median step time (ms) while exactly ``concurrency`` sequences decode together."""
    log = common.record_batches(eng)
    times: list[float] = []
    for i in range(concurrency):
        prompt = [100 + (i * 7 + j) % 40000 for j in range(prompt_len)]
        eng.add_request(
            prompt, SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
        )
    while eng.has_unfinished():
        t0 = common.now()
        eng.step()
        dt = common.now() - t0
        seqs, tokens = log[-1]
        if seqs == concurrency and tokens == concurrency:  # a pure decode step of all of them
            times.append(dt)
    return statistics.median(times[1:] or times) * 1e3


# -- roofline ----------------------------------------------------------------------------------
def gemm_step_s(model, batch: int, repeats: int = 5) -> float:
    """Median time of one step's matmuls alone at ``batch`` rows: the model's own weights through
    the model's own matmuls in its weight format (``chatpage.engine.model.weights.Linear``)."""
    linears = [f for layer in model.layers for f in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    linears.append(model.lm_head)
    inputs = {
        f.in_features: torch.randn(batch, f.in_features, dtype=model.mm_dtype) for f in linears
    }

    def step() -> None:
        for f in linears:
            f(inputs[f.in_features])

    with torch.inference_mode():
        return common.median_s(step, repeats=repeats, warmup=1)


def read_bandwidth(num_bytes: int = 256 << 20, repeats: int = 7) -> float:
    """Memory read bandwidth in bytes/s with the run's threads: the best median time of reducing
    (sum, max) a large fp32 tensor."""
    big = torch.ones(num_bytes // 4, dtype=torch.float32)
    return max(num_bytes / common.median_s(f, repeats, warmup=2) for f in (big.sum, big.amax))


def with_bandwidth(measure: Callable[[], T]) -> tuple[T, float]:
    """``measure()`` and the read bandwidth of the same seconds: the mean of one taken just before
    it and one just after. A shared machine's read rate drifts by 15% from one minute to the next,
    so a floor measured minutes away from the step it bounds says more about the drift."""
    before = read_bandwidth()
    result = measure()
    return result, (before + read_bandwidth()) / 2


def roofline(loaded, prompt_len: int, batch: int = ROOFLINE_BATCH) -> dict:
    eng = common.engine(loaded, max_num_seqs=max(batch, 1))
    _warm_up(eng)
    common.say(f"roofline: {batch} concurrent sequences")
    decode_ms = decode_step_ms(eng, batch, prompt_len, new_tokens=12)
    common.say("roofline: batch 1, and the memory bandwidth around it")
    batch1_ms, bandwidth = with_bandwidth(lambda: decode_step_ms(eng, 1, prompt_len, new_tokens=64))
    common.say("roofline: matmuls alone")
    gemm_s = gemm_step_s(eng.model, batch)
    batch1_gemm_s = gemm_step_s(eng.model, 1)
    floor_ms = eng.model.weight_bytes / bandwidth * 1e3
    decode_tok_s = batch / (decode_ms / 1e3)
    gemm_tok_s = batch / gemm_s
    return {
        "roofline_batch": batch,
        "roofline_context": prompt_len,
        "decode_batch_step_ms": decode_ms,
        "decode_batch_tok_s": decode_tok_s,
        "gemm_bound_tok_s": gemm_tok_s,
        "fraction_of_gemm_bound": decode_tok_s / gemm_tok_s,
        "batch1_step_ms": batch1_ms,
        "weight_bytes": eng.model.weight_bytes,
        "read_bandwidth_gb_s": bandwidth / 1e9,
        "weight_read_floor_ms": floor_ms,
        "batch1_floor_ratio": batch1_ms / floor_ms,
        "batch1_gemm_ms": batch1_gemm_s * 1e3,
        "batch1_gemm_read_gb_s": eng.model.weight_bytes / batch1_gemm_s / 1e9,
    }


# -- transformers --------------------------------------------------------------------------------
class _Deadline:
    """A transformers stopping criterion that ends generation once ``deadline`` has passed."""

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self.hit = False

    def __call__(self, input_ids, scores, **kwargs):
        self.hit = self.hit or common.now() > self.deadline
        return torch.full((input_ids.shape[0],), self.hit, dtype=torch.bool)


def hf_model(loaded):
    model = common.transformers_model(loaded.directory, loaded.gguf, torch.float32)
    model.eval()
    return model


def hf_batch(model, batch: list[BenchRequest], pad_id: int, stop: _Deadline | None = None) -> None:
    """One static batch through ``generate``: left padded, greedy, exactly the longest output."""
    from transformers import StoppingCriteriaList

    width = max(r.prompt_len for r in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, r in enumerate(batch):
        ids[i, width - r.prompt_len :] = torch.tensor(r.prompt_ids)
        mask[i, width - r.prompt_len :] = 1
    new = max(r.output_len for r in batch)
    with torch.inference_mode():
        model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            pad_token_id=pad_id,
            stopping_criteria=StoppingCriteriaList([stop]) if stop else None,
        )


def run_hf(
    model, trace: list[BenchRequest], batch_size: int, pad_id: int, best_s: float | None
) -> dict:
    """The trace in static batches of ``batch_size``; abandoned once it cannot beat ``best_s``
    (then ``seconds`` is None; ``projected_s`` is its linear projection when it was stopped on
    one, None when it ran past ``best_s``)."""
    useful = sum(r.output_len for r in trace)
    done = 0
    t0 = common.now()
    for i in range(0, len(trace), batch_size):
        batch = trace[i : i + batch_size]
        stop = _Deadline(t0 + best_s) if best_s else None
        hf_batch(model, batch, pad_id, stop)
        elapsed = common.now() - t0
        if stop and stop.hit:
            return {
                "batch": batch_size,
                "seconds": None,
                "abandoned_after_s": elapsed,
                "projected_s": None,
            }
        done += sum(r.output_len for r in batch)
        projected = elapsed * useful / done
        if (
            best_s
            and done < useful
            and done >= PROJECT_AFTER * useful
            and projected > best_s * ABANDON_MARGIN
        ):
            return {
                "batch": batch_size,
                "seconds": None,
                "abandoned_after_s": elapsed,
                "projected_s": projected,
            }
    return {"batch": batch_size, "seconds": common.now() - t0}


def best_hf(loaded, trace: list[BenchRequest], batches: list[int]) -> tuple[dict, list[dict]]:
    """The fastest of transformers' static batch sizes, and every one tried."""
    model = hf_model(loaded)
    pad_id = loaded.tokenizer.pad_token_id
    if pad_id is None:
        pad_id = loaded.tokenizer.eos_token_id or 0
    hf_batch(model, trace[:2], pad_id)  # warm-up
    useful = sum(r.output_len for r in trace)
    best: dict | None = None
    tried = []
    for b in batches:
        common.say(f"transformers: static batches of {b}")
        res = run_hf(model, trace, b, pad_id, best["seconds"] if best else None)
        if res["seconds"] is not None:
            res["tok_s"] = useful / res["seconds"]
            if best is None or res["seconds"] < best["seconds"]:
                best = res
        tried.append(res)
    del model
    if best is None:
        raise SystemExit(
            "chatpage: error: --hf-batches names no batch size to run transformers with"
        )
    return best, tried


def _gguf(model: str | None) -> Path | None:
    """The GGUF file behind ``--model`` (llama.cpp reads only those)."""
    if model is None:
        return default_model_path()
    path = Path(model).expanduser()
    return path if path.suffix == ".gguf" else None


# -- the command ----------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    p = common.parser(
        "throughput", "chatpage vs transformers generate, plus a roofline", DEFAULT_SCALE
    )
    p.add_argument(
        "--requests",
        type=int,
        default=None,
        help=f"number of requests (default {REQUESTS_AT_SCALE_1} x scale)",
    )
    p.add_argument(
        "--hf-batches",
        default=",".join(map(str, HF_BATCHES)),
        help="transformers batch sizes to try, first one in full (default %(default)s)",
    )
    p.add_argument("--no-roofline", action="store_true", help="skip the roofline measurements")
    p.add_argument(
        "--roofline-batch",
        type=int,
        default=ROOFLINE_BATCH,
        help="concurrent sequences of the roofline decode (default %(default)s)",
    )
    p.add_argument(
        "--weights",
        type=common.weight_formats,
        default=["bf16", "int4"],
        help="weight formats to run the trace in besides fp32 (default bf16,int4); "
        "transformers keeps fp32",
    )
    p.add_argument("--plot", default=None, help="write a PNG bar chart here")
    p.add_argument(
        "--peer",
        choices=["llamacpp"],
        action="append",
        default=[],
        help="also run a peer engine (needs llama-cpp-python)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = common.parse(_parser(), argv)
    n = args.requests or max(4, round(REQUESTS_AT_SCALE_1 * args.scale))
    batches = [int(b) for b in args.hf_batches.split(",") if b.strip()]

    loaded = common.load(args.model)
    trace = make_trace(
        SHAREGPT, n, scale=args.scale, seed=args.seed, vocab_size=loaded.config.vocab_size
    )
    shape = describe(trace)
    common.say(f"trace: {shape}")

    eng = common.engine(loaded)
    _warm_up(eng)
    common.say("chatpage: the whole trace")
    mine = run_chatpage(eng, trace)
    del eng
    chat_tok_s = shape["output_tokens"] / mine["seconds"]
    common.say(f"chatpage: {chat_tok_s:.1f} tok/s, mean batch {mine['mean_batch']:.1f}")

    formats = []
    for fmt in [f for f in args.weights if f != "fp32"]:
        common.say(f"chatpage {fmt}: the whole trace")
        eng = common.engine(loaded, weight_dtype=fmt)
        _warm_up(eng)
        run = run_chatpage(eng, trace)
        del eng
        formats.append(
            {
                "weights": fmt,
                "tok_s": shape["output_tokens"] / run["seconds"],
                "mean_batch": run["mean_batch"],
            }
        )

    hf, tried = best_hf(loaded, trace, batches)
    formats.insert(0, {"weights": "fp32", "tok_s": chat_tok_s, "mean_batch": mine["mean_batch"]})
    for f in formats:
        f["ratio"] = f["tok_s"] / hf["tok_s"]
    best = max(formats, key=lambda f: f["tok_s"])
    result = {
        "benchmark": "throughput",
        "workload": "sharegpt",
        "scale": args.scale,
        "seed": args.seed,
        **common.model_info(loaded),
        **shape,
        "chatpage_tok_s": chat_tok_s,
        "chatpage_seconds": mine["seconds"],
        "chatpage_mean_batch": mine["mean_batch"],
        "chatpage_steps": mine["steps"],
        "hf_tok_s": hf["tok_s"],
        "hf_seconds": hf["seconds"],
        "hf_batch": hf["batch"],
        "hf_candidates": tried,
        "ratio": chat_tok_s / hf["tok_s"],
        "formats": formats,
        "best_weights": best["weights"],
        "best_ratio": best["ratio"],
        "goal_ratio": GOAL_RATIO,
    }
    if not args.no_roofline:
        result.update(roofline(loaded, round(shape["mean_input"]), args.roofline_batch))
        result["goal_fraction_of_gemm_bound"] = GOAL_FRACTION_OF_GEMM_BOUND
        result["goal_batch1_floor_ratio"] = GOAL_BATCH1_FLOOR_RATIO
    if "llamacpp" in args.peer:
        from chatpage.bench import llamacpp

        result.update(llamacpp.run(_gguf(args.model), trace, chat_tok_s))
    if args.plot:
        result["plot"] = plots.throughput(result, args.plot)
    return common.emit(common.round_floats(result), args.json)


# -- the report ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class HfCandidate:
    batch: int
    tok_s: float | None = None
    abandoned_after_s: float | None = None


@dataclass(frozen=True)
class FormatRate:
    weights: str
    tok_s: float
    mean_batch: float
    ratio: float


@dataclass(frozen=True)
class Roofline:
    """The roofline fields of a run (absent under ``--no-roofline``)."""

    roofline_batch: int
    roofline_context: int
    decode_batch_step_ms: float
    decode_batch_tok_s: float
    gemm_bound_tok_s: float
    fraction_of_gemm_bound: float
    batch1_step_ms: float
    weight_bytes: int
    read_bandwidth_gb_s: float
    weight_read_floor_ms: float
    batch1_floor_ratio: float
    batch1_gemm_ms: float | None = None  # (older runs lack the matmuls alone)
    batch1_gemm_read_gb_s: float | None = None


@dataclass(frozen=True)
class ThroughputResult:
    """What the report reads of a run's JSON; older runs lack the weight formats."""

    requests: int
    scale: float
    threads: int
    mean_input: float
    mean_output: float
    longest: int
    chatpage_tok_s: float
    chatpage_mean_batch: float
    hf_tok_s: float
    hf_batch: int
    hf_candidates: list[HfCandidate]
    ratio: float
    formats: list[FormatRate] = field(default_factory=list)
    best_weights: str | None = None
    best_ratio: float | None = None
    llamacpp_serial_tok_s: float | None = None
    llamacpp_batched_tok_s: float | None = None
    roofline: Roofline | None = None

    @classmethod
    def read(cls, raw: Mapping[str, Any]) -> ThroughputResult:
        """The result, its roofline (flat in the JSON) gathered into :class:`Roofline`."""
        result = from_json(cls, raw)
        if "gemm_bound_tok_s" in raw:
            result = replace(result, roofline=from_json(Roofline, raw))
        return result


def goals(t: ThroughputResult) -> list[Goal]:
    rows = _format_goals(t)
    rows.append(
        at_least(
            "throughput", "chatpage / transformers useful tok/s", t.ratio, GOAL_RATIO, _why_ratio(t)
        )
    )
    f = t.roofline
    if f is not None:
        rows += [
            at_least(
                "throughput",
                f"decode rate at {f.roofline_batch} sequences / GEMM bound",
                f.fraction_of_gemm_bound,
                GOAL_FRACTION_OF_GEMM_BOUND,
                _why_gemm(f),
            ),
            at_most(
                "throughput",
                "batch-1 step / weight-read floor",
                f.batch1_floor_ratio,
                GOAL_BATCH1_FLOOR_RATIO,
                _why_floor(t, f),
            ),
        ]
    return rows


def _format_goals(t: ThroughputResult) -> list[Goal]:
    """The best weight format's ratio and the app's default format's."""
    if t.best_ratio is None:
        return []
    rows = [
        at_least(
            "throughput",
            f"chatpage ({t.best_weights}) / transformers (fp32) useful tok/s",
            t.best_ratio,
            GOAL_RATIO,
            "the best weight format on the same trace; "
            + ", ".join(f"{f.weights} {f.tok_s:.1f} tok/s" for f in t.formats)
            + f" against transformers' {t.hf_tok_s:.1f}",
        )
    ]
    default = next((f for f in t.formats if f.weights == DEFAULT_WEIGHTS), None)
    if default is not None:
        rows.append(
            at_least(
                "throughput",
                f"chatpage ({DEFAULT_WEIGHTS}, the default) / transformers (fp32) useful tok/s",
                default.ratio,
                GOAL_DEFAULT_RATIO,
                f"the app's default weight format, {default.tok_s:.1f} tok/s at a mean batch "
                f"of {default.mean_batch:.1f} on the same trace, against transformers' "
                f"{t.hf_tok_s:.1f}",
            )
        )
    return rows


def _why_ratio(t: ThroughputResult) -> str:
    text = (
        f"chatpage ran a mean batch of {t.chatpage_mean_batch:.1f} with no padding and no "
        f"waiting for a batch's longest request; transformers' best static batch "
        f"({t.hf_batch}) decodes every request of a batch until its longest ends "
        f"(longest {t.longest} tokens, mean output {t.mean_output:.0f})"
    )
    f = t.roofline
    if t.ratio >= GOAL_RATIO or f is None:
        return text
    need = GOAL_RATIO * t.hf_tok_s
    return (
        text + f". 8x would need {need:.0f} tok/s: "
        f"{need / f.gemm_bound_tok_s:.0%} of the matmul-only rate at batch "
        f"{f.roofline_batch} ({f.gemm_bound_tok_s:.0f} tok/s), for a trace whose mean "
        f"batch is {t.chatpage_mean_batch:.0f} and whose last requests decode nearly alone; "
        f"chatpage's own steps run at {f.fraction_of_gemm_bound:.0%} of that bound. "
        f"transformers is the faster side of the reference here: {t.hf_tok_s:.1f} tok/s "
        "against the 20.5 measured on the machine the goal was set on"
    )


def _why_gemm(f: Roofline) -> str:
    gemm_ms = f.roofline_batch / f.gemm_bound_tok_s * 1e3
    other = f.decode_batch_step_ms - gemm_ms
    return (
        f"a decode step of {f.roofline_batch} sequences took "
        f"{f.decode_batch_step_ms:.0f} ms, the matmuls alone {gemm_ms:.0f} ms; the other "
        f"{other:.0f} ms are paged attention over ~{f.roofline_context}-token contexts, "
        "norms, RoPE, the sampler and Python"
    )


def _why_floor(t: ThroughputResult, f: Roofline) -> str:
    text = (
        f"reading {f.weight_bytes / 1e6:.0f} MB of fp32 weights at "
        f"{f.read_bandwidth_gb_s:.1f} GB/s (a plain reduction on {t.threads} thread(s), "
        f"as the run, measured just before and after the step) takes "
        f"{f.weight_read_floor_ms:.1f} ms; the step took "
        f"{f.batch1_step_ms:.1f} ms"
    )
    if f.batch1_gemm_ms is not None:
        rest = f.batch1_step_ms - f.batch1_gemm_ms
        text += (
            f": its matmuls alone {f.batch1_gemm_ms:.1f} ms (they stream the weights at "
            f"{f.batch1_gemm_read_gb_s:.1f} GB/s, the native fp32 GEMV), the other "
            f"{rest:.1f} ms are attention, the fused norm/RoPE/SwiGLU ops, sampling and the "
            "engine's Python"
        )
        if f.batch1_floor_ratio > GOAL_BATCH1_FLOOR_RATIO:
            text += (
                "; the gap is the matmuls' shortfall from the floor's read rate plus the "
                "other work (the lower weight formats are the faster step)"
            )
    return text


def figures(r: ThroughputResult) -> list[str]:
    out = [
        f"{r.requests} ShareGPT-shaped requests at scale {r.scale} (mean input "
        f"{r.mean_input}, mean output {r.mean_output}, longest {r.longest}), "
        f"{r.threads} thread{'s' if r.threads != 1 else ''}, fp32, EOS ignored.",
        "",
        table(["system", "useful output tok/s", "batch"], _system_rows(r)),
        "",
        f"Ratio: **{r.ratio:.2f}x**"
        + (
            f" in fp32, **{r.best_ratio:.2f}x** in {r.best_weights}."
            if r.best_ratio is not None
            else "."
        ),
    ]
    f = r.roofline
    if f is None:
        return out
    rows: list[list[Any]] = [
        [f"GEMM bound at batch {f.roofline_batch} (tok/s)", f.gemm_bound_tok_s],
        [f"chatpage decode, {f.roofline_batch} sequences (tok/s)", f.decode_batch_tok_s],
        ["fraction of GEMM bound", f.fraction_of_gemm_bound],
        ["batch-1 step (ms)", f.batch1_step_ms],
        [f"read bandwidth, {r.threads} thread(s) (GB/s)", f.read_bandwidth_gb_s],
        ["weight-read floor (ms)", f.weight_read_floor_ms],
        ["batch-1 / floor", f.batch1_floor_ratio],
    ]
    if f.batch1_gemm_ms is not None:
        rows += [
            ["batch-1 matmuls alone (ms)", f.batch1_gemm_ms],
            ["their weight read rate (GB/s)", f.batch1_gemm_read_gb_s],
        ]
    return out + ["", table(["roofline", "value"], rows)]


def _system_rows(r: ThroughputResult) -> list[list[Any]]:
    """chatpage in each weight format, transformers' batches, llama.cpp where it ran."""
    rows: list[list[Any]] = [
        ["chatpage", r.chatpage_tok_s, r.chatpage_mean_batch],
        [f"transformers generate, batch {r.hf_batch}", r.hf_tok_s, r.hf_batch],
    ]
    for c in r.hf_candidates:
        if c.batch != r.hf_batch:
            state = (
                f"{c.tok_s:.1f}"
                if c.tok_s
                else f"abandoned after {c.abandoned_after_s:.0f} s (slower)"
            )
            rows.append([f"transformers, batch {c.batch}", state, c.batch])
    rows[1:1] = [
        [f"chatpage, {f.weights} weights", f.tok_s, f.mean_batch]
        for f in r.formats
        if f.weights != "fp32"
    ]
    if r.llamacpp_batched_tok_s is not None:
        rows.append(["llama.cpp serial", r.llamacpp_serial_tok_s, 1])
        rows.append(["llama.cpp batched", r.llamacpp_batched_tok_s, r.requests])
    return rows


SECTION = Section(ThroughputResult.read, goals, figures, plotted=True)
