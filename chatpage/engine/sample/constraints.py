"""The logits step before sampling: each row's logit bias, then its grammar's token mask.

One call per engine step over the rows that sample. The masks of all constrained rows are
computed together (llguidance's executor, in parallel) into one int32 bitmask, 32 tokens a word,
which is applied on the logits' device in place (on the CPU by the native `forbid_tokens`, one
pass; elsewhere `forbid`, bitwise ops on fp32 logits, its reference). Sampling, logprobs and beam
search all read the masked logits: a token the grammar forbids has probability 0.
A row whose bias or mask cannot be applied is returned with why, for its request to fail alone
(as the sampler does with a row it cannot sample); the other rows are constrained as ever.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from collections.abc import Sequence as Seq
from typing import TYPE_CHECKING, Any

import torch

from chatpage.engine.model import ops
from chatpage.engine.sampling_params import SamplingParams
from chatpage.engine.text.grammar import GrammarMatcher

if TYPE_CHECKING:
    import llguidance

_BITS = torch.arange(32, dtype=torch.int32)


class LogitConstraints:
    """Applies logit biases and grammar masks; counts the time the masks take by ``clock``
    (a benchmark sets its own, to measure the masks by the clock it measures the steps by)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._executor: llguidance.LLExecutor | None = None
        self._bitmask: torch.Tensor | None = None
        self.clock = clock
        self.mask_seconds = 0.0  # spent computing and applying masks, since the start
        self.masked_rows = 0

    @torch.inference_mode()  # (the logits are the model's inference tensors)
    def apply(
        self, logits: torch.Tensor, rows: Seq[tuple[int, SamplingParams, GrammarMatcher | None]]
    ) -> dict[int, Exception]:
        """Change ``logits`` [N, V] in place: for each (row, params, matcher), add the row's
        logit bias, then forbid what its matcher does not allow. Returns the rows that could
        not be constrained, with why (their logits are not to be sampled)."""
        failed: dict[int, Exception] = {}
        constrained: list[tuple[int, GrammarMatcher]] = []
        for row, params, matcher in rows:
            try:
                if params.logit_bias:
                    ids = torch.tensor(list(params.logit_bias), device=logits.device)
                    bias = torch.tensor(
                        list(params.logit_bias.values()), dtype=logits.dtype, device=logits.device
                    )
                    logits[row, ids] += bias
            except Exception as e:  # (e.g. an id past the vocabulary): this row alone
                failed[row] = e
                continue
            if matcher is not None:
                constrained.append((row, matcher))
        if constrained:
            t0 = self.clock()
            try:
                self._mask(logits, constrained)
            except Exception:  # one row's matcher: find it, row by row, and mask the others
                for row, matcher in constrained:
                    try:
                        self._mask(logits, [(row, matcher)])
                    except Exception as e:
                        failed[row] = e
            self.mask_seconds += self.clock() - t0
            self.masked_rows += len(constrained)
        return failed

    def _mask(self, logits: torch.Tensor, constrained: list[tuple[int, GrammarMatcher]]) -> None:
        import llguidance

        if self._executor is None:
            self._executor = llguidance.LLExecutor()
        n, vocab = len(constrained), logits.shape[1]
        words = (vocab + 31) // 32
        if self._bitmask is None or self._bitmask.shape[0] < n or self._bitmask.shape[1] != words:
            self._bitmask = torch.empty(max(n, 32), words, dtype=torch.int32)
        bitmask = self._bitmask[:n]
        pairs: list[tuple[Any, int]] = [(m.raw, i) for i, (_, m) in enumerate(constrained)]
        self._executor.unsafe_compute_mask_ptr(pairs, bitmask.data_ptr(), words * 4, n)
        bitmask = bitmask.to(logits.device)
        rows = [row for row, _ in constrained]
        whole = rows == list(range(logits.shape[0])) and logits.is_contiguous()
        index = None if whole else torch.tensor(rows, device=logits.device)
        sub = logits if index is None else logits.index_select(0, index)
        if sub.dtype == torch.float32 and sub.device.type == "cpu" and ops.available("cpu"):
            torch.ops.chatpage.forbid_tokens(sub, bitmask)  # (csrc/cpu/sample.cpp: forbid's)
        elif sub.dtype == torch.float32:
            forbid(sub, bitmask, vocab)
        else:
            sub.masked_fill_(~unpack(bitmask, vocab), float("-inf"))
        if index is not None:
            logits.index_copy_(0, index, sub)


_NEG_INF_BITS = int(torch.tensor(float("-inf")).view(torch.int32))


def forbid(logits: torch.Tensor, bitmask: torch.Tensor, vocab: int) -> None:
    """Set to -inf, in place, the fp32 ``logits`` [N, vocab] whose bit in ``bitmask`` is 0, as
    ``masked_fill_(~unpack(...))`` would, by bitwise ops on their int32 view (half its time
    on the CPU: no boolean mask, whose masked fill is slow)."""
    bits = _BITS.to(bitmask.device)
    keep = ((bitmask.unsqueeze(-1) >> bits) & 1).neg_().flatten(1)[:, :vocab]  # -1 or 0
    raw = logits.view(torch.int32)
    raw.bitwise_and_(keep).bitwise_or_(keep.bitwise_not_().bitwise_and_(_NEG_INF_BITS))


def unpack(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """An int32 bitmask [N, words] (bit b of word w: token 32 w + b) as bools [N, vocab]."""
    bits = _BITS.to(bitmask.device)
    return ((bitmask.unsqueeze(-1) >> bits) & 1).bool().flatten(1)[:, :vocab]
