"""The stop check: whether a generated token ends its output, and why (plain, sampled and beam
rows alike)."""

from __future__ import annotations

from dataclasses import dataclass

from chatpage.engine.core.sequence import Sequence
from chatpage.engine.sampling_params import SamplingParams
from chatpage.vocab import FinishReason


@dataclass(frozen=True, slots=True)
class StopCheck:
    """The model's end-of-sequence ids and context window, against a request's stop rules."""

    eos_ids: frozenset[int]
    max_model_len: int

    def ends_on(self, params: SamplingParams, token: int) -> bool:
        """``token`` ends an output by itself: a stop token, or EOS unless ignore_eos. (Beam
        search asks this of its candidates before they join a beam.)"""
        return token in params.stop_token_ids or (token in self.eos_ids and not params.ignore_eos)

    def __call__(self, params: SamplingParams, seq: Sequence) -> FinishReason | None:
        """Why ``seq`` ends with the token just appended to it, if it does: STOP on a stop or EOS
        token or a stop string (the detokenizer, brought up to date here, finds it), LENGTH at
        max_tokens or the context window. A grammar that is complete ends it (STOP); one
        that is not yet leaves EOS forbidden, so max_tokens ends it (LENGTH: the structure
        is unfinished). An ended output's text is brought up to its end, an incomplete last
        character included (as decoding the whole output shows it)."""
        if self.ends_on(params, seq.token_ids[-1]):  # (the text stops before that token)
            seq.detok.update(seq.token_ids[:-1], final=True)
            return FinishReason.STOP
        if seq.matcher is not None and seq.matcher.done:
            seq.detok.update(seq.token_ids, final=True)
            return FinishReason.STOP
        length = seq.num_output_tokens >= params.max_tokens or len(seq) >= self.max_model_len
        if seq.detok.update(seq.token_ids, final=length):
            return FinishReason.STOP
        return FinishReason.LENGTH if length else None
