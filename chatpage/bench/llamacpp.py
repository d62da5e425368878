"""Peer engines for the throughput benchmark (optional; never part of ``make test``).

llama.cpp through llama-cpp-python, on the same GGUF file and the same number of threads:

* serial: one request at a time (prompt in one batch, then one token per decode call), the way a
  single-user app drives it;
* batched: every request as its own sequence id in one context, one ``llama_decode`` per step over
  all live sequences (its native continuous batching), greedy, exactly each output length.

llama-cpp-python has no wheel for this machine; build it with
``CMAKE_ARGS="$(scripts/llamacpp_cmake_args.sh)" .venv/bin/pip install llama-cpp-python`` (about 7
minutes; the script leaves out ggml's AMX kernels, which crash on these machines).
"""

from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path

import torch

from chatpage.bench import common
from chatpage.bench.workloads import BenchRequest


def available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def has_amx() -> bool:
    """Whether the installed llama.cpp runs ggml's AMX kernels (its system info says
    ``AMX_INT8 = 1``): scripts/llamacpp_cmake_args.sh leaves them out where they crash."""
    import llama_cpp

    return b"AMX_INT8 = 1" in llama_cpp.llama_print_system_info()


def _clear_memory(lib, ctx) -> None:
    """Empty the context's KV cache (the function's name changed across llama.cpp versions)."""
    if hasattr(lib, "llama_get_memory") and hasattr(lib, "llama_memory_clear"):
        lib.llama_memory_clear(lib.llama_get_memory(ctx), True)
    elif hasattr(lib, "llama_kv_self_clear"):
        lib.llama_kv_self_clear(ctx)
    else:
        lib.llama_kv_cache_clear(ctx)


class _Context:
    """A llama.cpp context with room for ``n_seq`` sequences of ``n_ctx`` tokens in total."""

    def __init__(self, lib, model, n_ctx: int, n_batch: int, n_seq: int, threads: int) -> None:
        self.lib = lib
        params = lib.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = n_batch
        params.n_ubatch = n_batch
        params.n_seq_max = n_seq
        params.n_threads = threads
        params.n_threads_batch = threads
        new = getattr(lib, "llama_init_from_model", None) or lib.llama_new_context_with_model
        self.ctx = new(model, params)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a context")
        self.n_batch = n_batch
        self.batch = lib.llama_batch_init(n_batch, 0, n_seq)
        vocab = lib.llama_model_get_vocab(model) if hasattr(lib, "llama_model_get_vocab") else None
        self.n_vocab = (
            lib.llama_vocab_n_tokens(vocab) if vocab is not None else lib.llama_n_vocab(model)
        )

    def close(self) -> None:
        self.lib.llama_batch_free(self.batch)
        self.lib.llama_free(self.ctx)

    def decode(self, entries: list[tuple[int, int, int, bool]]) -> list[int]:
        """Run ``(token, position, seq_id, wants_logits)`` entries in n_batch chunks; returns the
        greedy next token of every entry that wanted logits, in order."""
        picks: list[int] = []
        for start in range(0, len(entries), self.n_batch):
            chunk = entries[start : start + self.n_batch]
            b = self.batch
            b.n_tokens = len(chunk)
            for i, (tok, pos, seq, logits) in enumerate(chunk):
                b.token[i] = tok
                b.pos[i] = pos
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = seq
                b.logits[i] = 1 if logits else 0
            if self.lib.llama_decode(self.ctx, b) != 0:
                raise RuntimeError("llama_decode failed (context too small?)")
            for i, (_tok, _pos, _seq, logits) in enumerate(chunk):
                if logits:
                    ptr = self.lib.llama_get_logits_ith(self.ctx, i)
                    row = (ctypes.c_float * self.n_vocab).from_address(
                        ctypes.addressof(ptr.contents)
                    )
                    picks.append(int(torch.frombuffer(row, dtype=torch.float32).argmax()))
        return picks


def _serial(lib, model, trace: list[BenchRequest], threads: int) -> float:
    n_ctx = max(r.total_len for r in trace) + 16
    ctx = _Context(lib, model, n_ctx, 512, 1, threads)
    try:
        t0 = common.now()
        for r in trace:
            _clear_memory(lib, ctx.ctx)
            n = r.prompt_len
            entries = [(t, i, 0, i == n - 1) for i, t in enumerate(r.prompt_ids)]
            (tok,) = ctx.decode(entries)
            for step in range(r.output_len - 1):
                (tok,) = ctx.decode([(tok, n + step, 0, True)])
        return common.now() - t0
    finally:
        ctx.close()


def _batched(lib, model, trace: list[BenchRequest], threads: int) -> float:
    n_ctx = sum(r.total_len for r in trace) + 16 * len(trace)
    ctx = _Context(lib, model, n_ctx, 512, len(trace), threads)
    try:
        t0 = common.now()
        entries = []
        for s, r in enumerate(trace):
            entries += [(t, i, s, i == r.prompt_len - 1) for i, t in enumerate(r.prompt_ids)]
        last = dict(enumerate(ctx.decode(entries)))  # seq -> its next token
        made = dict.fromkeys(last, 1)
        while True:
            live = [s for s in last if made[s] < trace[s].output_len]
            if not live:
                break
            step = [(last[s], trace[s].prompt_len + made[s] - 1, s, True) for s in live]
            for s, tok in zip(live, ctx.decode(step), strict=True):
                last[s] = tok
                made[s] += 1
        return common.now() - t0
    finally:
        ctx.close()


class LlamaCppSingle:
    """llama.cpp at batch 1 on ``gguf`` with the run's threads, one pass at a time (so a benchmark
    can alternate it with its own passes): each pass times the first token (the prompt in one
    batch) and the decode rate of ``new_tokens`` - 1 more greedy tokens. Close it when done."""

    def __init__(self, gguf: Path, prompt_ids: list[int], new_tokens: int) -> None:
        from llama_cpp import Llama
        from llama_cpp import llama_cpp as lib

        threads = torch.get_num_threads()
        self._llm = Llama(model_path=str(gguf), n_ctx=512, n_threads=threads, verbose=False)
        self._lib = lib
        self.prompt_ids, self.new_tokens = prompt_ids, new_tokens
        self.amx = has_amx()  # how this llama.cpp was built: the report says so
        n = len(prompt_ids)
        self._ctx = _Context(lib, self._llm.model, n + new_tokens + 16, 512, 1, threads)

    def run(self) -> dict:
        """One pass: {"llamacpp_ttft_ms", "llamacpp_tok_s"}."""
        prompt, n = self.prompt_ids, len(self.prompt_ids)
        _clear_memory(self._lib, self._ctx.ctx)
        t0 = common.now()
        (tok,) = self._ctx.decode([(t, i, 0, i == n - 1) for i, t in enumerate(prompt)])
        t1 = common.now()
        for step in range(self.new_tokens - 1):
            (tok,) = self._ctx.decode([(tok, n + step, 0, True)])
        return {
            "llamacpp_ttft_ms": (t1 - t0) * 1e3,
            "llamacpp_tok_s": (self.new_tokens - 1) / (common.now() - t1),
        }

    def close(self) -> None:
        self._ctx.close()


def run(gguf: Path | None, trace: list[BenchRequest], chatpage_tok_s: float) -> dict:
    """llama.cpp's serial and batched rates on ``trace`` (fields for the throughput JSON)."""
    if not available():
        return {"llamacpp_error": "llama_cpp is not importable (pip install llama-cpp-python)"}
    if gguf is None:
        return {
            "llamacpp_error": "llama.cpp needs a .gguf model (the default model or --model X.gguf)"
        }
    from llama_cpp import Llama
    from llama_cpp import llama_cpp as lib

    threads = torch.get_num_threads()
    common.say(f"llama.cpp: loading {gguf.name}")
    llm = Llama(model_path=str(gguf), n_ctx=512, n_threads=threads, verbose=False)
    useful = sum(r.output_len for r in trace)
    common.say("llama.cpp: serial")
    serial = useful / _serial(lib, llm.model, trace, threads)
    common.say("llama.cpp: batched")
    batched = useful / _batched(lib, llm.model, trace, threads)
    return {
        "llamacpp_serial_tok_s": serial,
        "llamacpp_batched_tok_s": batched,
        "ratio_vs_llamacpp_batched": chatpage_tok_s / batched,
    }


def text_ids(gguf: Path, text: str) -> tuple[list[int], bool]:
    """llama.cpp's ids of ``text`` on ``gguf``'s vocabulary, with the special tokens the file asks
    for around a text, and whether they start with its BOS (``tokenizer.ggml.add_bos_token``)."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(gguf), vocab_only=True, verbose=False)
    try:
        ids = list(llm.tokenize(text.encode("utf-8"), add_bos=True, special=False))
        return ids, bool(ids) and ids[0] == llm.token_bos()
    finally:
        llm.close()


def perplexity(gguf: Path, ids: list[int]) -> float:
    """llama.cpp's perplexity of ``ids[1:]`` given the tokens before each, on ``gguf`` (one context
    holding them all, every position's logits kept: ``logits_all``), with the run's threads."""
    from llama_cpp import Llama

    threads = torch.get_num_threads()
    llm = Llama(
        model_path=str(gguf),
        n_ctx=len(ids) + 16,
        n_batch=512,
        n_threads=threads,
        n_threads_batch=threads,
        logits_all=True,
        verbose=False,
    )
    try:
        llm.eval(ids)
        logits = torch.from_numpy(llm.scores[: len(ids) - 1].copy())
    finally:
        llm.close()
    nll = torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:]))
    return float(torch.exp(nll))
