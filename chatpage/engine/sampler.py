"""Token selection: greedy, temperature, top-k, top-p with per-sequence generators."""

from __future__ import annotations

import torch

from chatpage.engine.sampling_params import SamplingParams


def make_generator(
    seed: int | None, index: int, device: torch.device | str = "cpu"
) -> torch.Generator:
    """The generator of output ``index`` of a request, on the device that samples:
    reproducible from (seed, index)."""
    g = torch.Generator(device=device)
    if seed is None:
        g.seed()
    else:
        g.manual_seed((seed * 0x9E3779B97F4A7C15 + index) % (1 << 63))
    return g


# Sampling looks at the best few hundred tokens first: the top-k set or the top-p nucleus almost
# always lies inside them, which saves sorting the whole vocabulary. When it does not, the full
# vocabulary is used; either way the distribution sampled from is exactly the filtered one.
_CANDIDATES = 256


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
        drop[0] = False  # the top token always (a top_p below float32's range is 0)
        # scattered back in place of a boolean index, which would wait for the device
        logits = logits.scatter(0, order, sorted_logits.masked_fill(drop, float("-inf")))
    return logits


def _draw_vocab(row: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token from the whole vocabulary of ``row`` (logits, on the CPU), exactly as
    multinomial over its softmax would, in two steps: whether it is among the best
    `_CANDIDATES` (their mass against one uniform draw), then which, in proportion, among
    those or among the rest. torch.multinomial over a 49k vocabulary takes ~1.7 ms on the CPU
    (an exponential race: one random number per token), most of a batched step's sampling; the
    best few hundred tokens usually hold most of the mass, so the race is mostly run over them.
    A distribution with NaNs still raises, from multinomial."""
    values, ids = torch.topk(row, _CANDIDATES)
    log_z = torch.logsumexp(row, 0)
    probs = (values - log_z).exp()
    if float(torch.rand((), generator=generator, dtype=torch.float64)) < float(probs.sum()):
        return ids[torch.multinomial(probs, 1, generator=generator)].view(())
    rest = (row - log_z).exp().index_fill_(0, ids, 0.0)
    return torch.multinomial(rest, 1, generator=generator).view(())


def _sample_row(
    row: torch.Tensor, p: SamplingParams, generator: torch.Generator | None
) -> torch.Tensor:
    """One token (a 0-dim tensor on ``row``'s device) from ``row`` (raw logits) under
    temperature, top-k and top-p. Nothing here waits for a GPU: there the whole filtered
    vocabulary is sampled from (sorting it costs a GPU little), since the candidates shortcut
    must look at the candidates' mass on the host to know whether they suffice."""
    row = row / p.temperature
    vocab = row.shape[-1]
    k = p.top_k if 0 < p.top_k < vocab else vocab
    if k == vocab and p.top_p >= 1.0:
        if row.device.type == "cpu" and vocab > _CANDIDATES:
            return _draw_vocab(row, generator)
        return torch.multinomial(row.softmax(-1), 1, generator=generator).view(())
    if row.device.type == "cpu" and (k <= _CANDIDATES or (k == vocab and p.top_p < 1.0)):
        values, ids = torch.topk(row, min(k, _CANDIDATES))  # best first
        log_z = torch.logsumexp(values if k <= _CANDIDATES else row, 0)
        probs = (values - log_z).exp()  # true probabilities within the top-k set
        cum = probs.cumsum(0)
        if p.top_p >= 1.0 or cum[-1] >= p.top_p or len(ids) == k:
            keep = (cum - probs) < p.top_p  # the nucleus (a prefix): stop once top_p is reached
            keep[0] = True  # and the top token always (a tiny top_p is 0 in float32)
            choice = torch.multinomial(probs.masked_fill(~keep, 0), 1, generator=generator)
            return ids[choice].view(())
    probs = _filter(row, p.top_k, p.top_p).softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).view(())


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> tuple[list[int], list[float], list[dict[int, float] | None], dict[int, Exception]]:
    """Pick one token per row of ``logits`` [N, V]; return tokens, their log-probabilities,
    for the rows whose params ask for alternatives (``logprobs`` > 0) the most likely tokens',
    and the rows that could not be sampled, with why (their token is the top one; the caller
    fails their requests): one row's failure never costs another row its token.

    Log-probabilities are ``log_softmax`` of the model's raw logits, whatever the sampling.
    Everything runs on the logits' device (``generators`` included); only the results come back,
    in one copy per call (on a GPU the rows' draws never wait for each other).
    """
    logprobs = torch.log_softmax(logits, dim=-1)
    # the first of the best, as argmax; torch's max over a dim is ~3x faster on the CPU
    picked = logits.max(dim=-1).indices
    failed: dict[int, Exception] = {}
    rows: list[int] = []
    drawn: list[torch.Tensor] = []
    for i, p in enumerate(params):
        if not p.greedy:
            try:
                drawn.append(_sample_row(logits[i], p, generators[i]))
                rows.append(i)
            except Exception as e:  # e.g. a distribution of NaNs: this row's request fails
                failed[i] = e
    if rows:
        picked = picked.index_put((torch.tensor(rows, device=logits.device),), torch.stack(drawn))
    chosen = logprobs.gather(1, picked.unsqueeze(1)).squeeze(1)
    # one copy to the host for the whole batch (ids are exact in float64)
    both = torch.stack([picked.double(), chosen.double()]).cpu()
    tokens = [int(t) for t in both[0].tolist()]
    chosen_lp = both[1].tolist()
    tops: list[dict[int, float] | None] = [None] * len(params)
    asking = [i for i, p in enumerate(params) if p.top_logprobs]
    if asking:
        found = top_logprobs(logprobs, asking, [params[i].top_logprobs for i in asking])
        for i, top in zip(asking, found, strict=True):
            tops[i] = top
    return tokens, chosen_lp, tops, failed


def top_logprobs(
    logprobs: torch.Tensor, rows: list[int], counts: list[int]
) -> list[dict[int, float]]:
    """The ``counts[j]`` most likely tokens of row ``rows[j]`` of ``logprobs`` [N, V], as
    token id -> log-probability, best first. One top-k over those rows, on their device."""
    if rows != list(range(logprobs.shape[0])):
        logprobs = logprobs[torch.tensor(rows, device=logprobs.device)]
    values, ids = torch.topk(logprobs, max(counts), dim=-1)
    return [
        dict(zip(i[:k], v[:k], strict=True))
        for i, v, k in zip(ids.cpu().tolist(), values.cpu().tolist(), counts, strict=True)
    ]


def beam_candidates(
    logprobs: torch.Tensor, cumulative: list[float], count: int
) -> list[tuple[int, int, float]]:
    """The ``count`` best continuations over all live beams.

    ``logprobs`` [B, V] are the beams' next-token log-probabilities and ``cumulative`` their scores
    so far; returns (beam index, token, new cumulative log-probability), best first.
    """
    so_far = torch.tensor(cumulative, dtype=logprobs.dtype, device=logprobs.device)
    scores = logprobs + so_far.unsqueeze(1)
    vocab = scores.shape[1]
    values, flat = torch.topk(scores.flatten(), min(count, scores.numel()))
    return [
        (int(f) // vocab, int(f) % vocab, float(v))
        for v, f in zip(values.cpu().tolist(), flat.cpu().tolist(), strict=True)
    ]
