"""A request in, the `SequenceGroup` the scheduler runs out, or a refusal (as vLLM's processor).

The prompt is tokenized and checked against the model (its vocabulary, its context window) and
the engine (its sequences per step, its KV pool, the log-probabilities one request may keep)
before anything is queued; the group's first sequence gets its detokenizer, grammar matcher,
thinking splitter, tool-call parser and generator here, once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from chatpage.engine.config import EngineConfig
from chatpage.engine.core.block_manager import BlockManager
from chatpage.engine.core.sequence import Sequence, SequenceGroup
from chatpage.engine.load.loader import PLAIN_TURN_STOPS
from chatpage.engine.sample.sampler import make_generator
from chatpage.engine.sampling_params import MAX_LOGPROB_ENTRIES, SamplingParams
from chatpage.engine.text.detokenizer import IncrementalDetokenizer
from chatpage.engine.text.grammar import Grammars
from chatpage.engine.text.reasoning import ReasoningFormat
from chatpage.engine.text.tokenizer import TextTokenizer
from chatpage.engine.text.tool_calls import ToolFormat
from chatpage.vocab import UserError


class RequestRefused(UserError):
    """A request the engine cannot run as asked (an empty prompt, one too long for the context
    window, more sequences or KV blocks than there are); the message says what to change."""


@dataclass(frozen=True, slots=True)
class Processor:
    """What a request is checked against and built with: the engine's tokenizer, grammars,
    thinking markers and tool-call format (None: the model has none), vocabulary, context
    window, config, block manager (its pool's size) and device."""

    tokenizer: TextTokenizer
    grammars: Grammars
    reasoning: ReasoningFormat | None
    tool_format: ToolFormat
    base_model: bool  # no chat template: chats in the plain format
    vocab_size: int
    max_model_len: int
    config: EngineConfig
    bm: BlockManager
    block_bytes: int
    device: torch.device

    def prompt(
        self, prompt: str | list[int], params: SamplingParams, chat: bool, add_special_tokens: bool
    ) -> tuple[list[int], SamplingParams]:
        """The prompt's token ids and the params it runs with (a base model's chat reply
        stops where it starts another turn), checked to fit (`RequestRefused` if not)."""
        if chat and self.base_model:
            params = replace(params, stop=[*params.stop, *PLAIN_TURN_STOPS])
        ids = (
            self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
            if isinstance(prompt, str)
            else list(prompt)
        )
        self._check_fits(ids, params)
        return ids, params

    def group(
        self,
        request_id: str,
        ids: list[int],
        params: SamplingParams,
        *,
        pin_prefix: bool,
        split_thinking: bool,
        tool_calls: bool,
    ) -> SequenceGroup:
        """The request's group of one sequence, ready to schedule."""
        first = Sequence(
            list(ids), len(ids), IncrementalDetokenizer(self.tokenizer, ids, params.stop)
        )
        if params.structured is not None:
            first.matcher = self.grammars.matcher(params.structured)
        thinking = (
            self.reasoning.splitter(self.tokenizer.decode(ids[-8:]))
            if split_thinking and self.reasoning is not None
            else None
        )
        first.thinking = thinking.copy() if thinking is not None else None
        tools = self.tool_format.stream() if tool_calls else None
        first.tools = tools.copy() if tools is not None else None
        if not params.use_beam_search:
            first.generator = make_generator(params.seed, 0, self.device)
        return SequenceGroup(
            request_id,
            list(ids),
            params,
            [first],
            pin_prefix=pin_prefix,
            thinking=thinking,
            tools=tools,
        )

    def _check_fits(self, ids: list[int], params: SamplingParams) -> None:
        if not ids:
            raise RequestRefused("the prompt is empty: give at least one token")
        vocab = self.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise RequestRefused(
                f"prompt token ids must be in [0, {vocab}), the model's vocabulary"
            )
        if params.logit_bias and max(params.logit_bias) >= vocab:
            raise RequestRefused(
                f"logit_bias names token {max(params.logit_bias)}, which is not in the "
                f"model's vocabulary (ids 0 to {vocab - 1})"
            )
        n = len(ids)
        if params.width > self.config.max_num_seqs:
            raise RequestRefused(
                f"the request runs {params.width} sequences at once (n or beam_width) but "
                f"max_num_seqs={self.config.max_num_seqs}; lower n / beam_width or raise "
                "max_num_seqs"
            )
        if n >= self.max_model_len:
            raise RequestRefused(
                f"the prompt is {n} tokens but the context window is {self.max_model_len} "
                f"(max_model_len); shorten it by at least {n - self.max_model_len + 1} tokens"
            )
        longest = min(n + params.max_tokens, self.max_model_len)
        entries = params.width * (longest - n) * (params.top_logprobs + 1)
        if params.logprobs is not None and entries > MAX_LOGPROB_ENTRIES:
            raise RequestRefused(
                f"the request asks for up to {entries} log-probabilities (n {params.width} x "
                f"max_tokens {longest - n} x (top_logprobs {params.top_logprobs} + 1)), more "
                f"than the {MAX_LOGPROB_ENTRIES} one request may have; lower one of them"
            )
        need = self.bm.peak_blocks(n, longest, params.width, self.config.max_num_batched_tokens)
        have = self.bm.pool.num_blocks - self.bm.pool.num_pinned
        if need > have:
            raise RequestRefused(
                f"the request needs {need} KV blocks ({need * self.block_bytes / 2**20:.0f} MiB) "
                f"at its longest but the KV cache holds {have} besides pinned prefixes "
                f"({have * self.block_bytes / 2**20:.0f} MiB); raise the KV cache size "
                "(--kv-cache / EngineConfig.kv_cache_bytes) or lower max_tokens"
            )
