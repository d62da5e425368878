"""Token selection: greedy, temperature, top-k, top-p with per-sequence generators."""

from __future__ import annotations

import torch

from chatpage.engine.sampling_params import SamplingParams


def make_generator(seed: int | None, index: int) -> torch.Generator:
    """The generator of output ``index`` of a request: reproducible from (seed, index)."""
    g = torch.Generator()
    if seed is None:
        g.seed()
    else:
        g.manual_seed((seed * 0x9E3779B97F4A7C15 + index) % (1 << 63))
    return g


def _filter(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask (to -inf) tokens outside the top-k and the top-p nucleus of one row."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop a token when the tokens ranked above it already reach top_p
        drop = (probs.cumsum(-1) - probs) >= top_p
        logits = logits.clone()
        logits[order[drop]] = float("-inf")
    return logits


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> tuple[list[int], list[float]]:
    """Pick one token per row of ``logits`` [N, V]; return tokens and their log-probabilities.

    Log-probabilities are ``log_softmax`` of the model's raw logits, whatever the sampling.
    """
    logprobs = torch.log_softmax(logits, dim=-1)
    tokens = logits.argmax(dim=-1).tolist()
    for i, p in enumerate(params):
        if p.greedy:
            continue
        row = _filter(logits[i] / p.temperature, p.top_k, p.top_p)
        probs = row.softmax(-1)
        tokens[i] = int(torch.multinomial(probs, 1, generator=generators[i]))
    chosen = logprobs.gather(1, torch.tensor(tokens).unsqueeze(1)).squeeze(1).tolist()
    return tokens, chosen


def beam_candidates(
    logprobs: torch.Tensor, cumulative: list[float], count: int
) -> list[tuple[int, int, float]]:
    """The ``count`` best continuations over all live beams.

    ``logprobs`` [B, V] are the beams' next-token log-probabilities and ``cumulative`` their scores
    so far; returns (beam index, token, new cumulative log-probability), best first.
    """
    scores = logprobs + torch.tensor(cumulative, dtype=logprobs.dtype).unsqueeze(1)
    vocab = scores.shape[1]
    values, flat = torch.topk(scores.flatten(), min(count, scores.numel()))
    return [
        (int(f) // vocab, int(f) % vocab, float(v))
        for v, f in zip(values.tolist(), flat.tolist(), strict=True)
    ]
