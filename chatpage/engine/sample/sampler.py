"""Token selection: greedy, temperature, top-k, top-p with per-sequence generators."""

from __future__ import annotations

import torch

from chatpage.engine.model import ops
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


def _sample_row(
    row: torch.Tensor, p: SamplingParams, generator: torch.Generator | None
) -> torch.Tensor:
    """One token (a 0-dim tensor on ``row``'s device) from ``row`` (raw logits) under
    temperature, top-k and top-p, from the whole filtered vocabulary: a GPU's rows (sorting a
    row costs a GPU little, and nothing here waits for it), and the CPU's rows that `_draw_cpu`
    leaves. A distribution with NaNs raises, from multinomial."""
    probs = _filter(row / p.temperature, p.top_k, p.top_p).softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).view(())


def _plain(p: SamplingParams, vocab: int) -> bool:
    """Whether a sampled row draws from its whole vocabulary (no top-k, no top-p)."""
    return not 0 < p.top_k < vocab and p.top_p >= 1.0


def _native_rows(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> tuple[torch.Tensor, torch.Tensor, list[bool]] | None:
    """On the CPU with the native kernels, fp32 ``logits`` [N, V] through
    ``torch.ops.chatpage.sample_rows`` (csrc/cpu/sample.cpp): every row's greedy pick and
    logsumexp, and the plain sampled rows' draws (a uniform from each row's own generator, as
    `_draw_cpu` takes one), with which rows it drew; a pick of -1 for a row that is not finite.
    None elsewhere."""
    if logits.device.type != "cpu" or logits.dtype != torch.float32 or not ops.available("cpu"):
        return None
    vocab = logits.shape[1]
    drawn = [not p.greedy and _plain(p, vocab) for p in params]
    # (a temperature past float32's range is inf there, as the torch code's tensor makes it)
    temps = torch.tensor(
        [p.temperature if d else 0.0 for p, d in zip(params, drawn, strict=True)],
        dtype=torch.float32,
    )
    uniforms = torch.zeros(len(params), dtype=torch.float64)
    for i, d in enumerate(drawn):
        if d:
            uniforms[i] = torch.rand(1, generator=generators[i], dtype=torch.float64)
    picks, lse = torch.ops.chatpage.sample_rows(logits.contiguous(), temps, uniforms)
    return picks, lse, drawn


def _pick(weights: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """Per row of ``weights`` [R, C] (non-negative, one positive at least), the index that
    ``at`` [R] in [0, 1) lands on when the row's weights are laid end to end and scaled to 1:
    always a positive weight's (for a row with none, which its caller does not use, any)."""
    cum = weights.cumsum(-1)
    x = (at * cum[:, -1].double()).to(cum.dtype).unsqueeze(1)
    index = torch.searchsorted(cum, x, right=True).squeeze(1).clamp_(max=weights.shape[1] - 1)
    past = (weights.gather(1, index.unsqueeze(1)).squeeze(1) <= 0).nonzero().flatten()
    if past.numel():  # rounding carried x past the last positive weight: take that one
        w = weights[past]
        index[past] = torch.where(w > 0, torch.arange(w.shape[1]), 0).amax(-1)
    return index


def _draw_cpu(
    logits: torch.Tensor,
    rows: list[int],
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> tuple[list[int], torch.Tensor]:
    """Draw the CPU rows ``rows`` of ``logits`` [N, V] together, one uniform from each row's own
    generator, so that no row's draw depends on another's; returns the rows drawn and their
    tokens. The rows left are for `_sample_row`: a top-k past the candidates, a nucleus that
    spills past them, a row that is not finite.

    A row with neither top-k nor top-p draws from its whole vocabulary by the inverse of its
    cumulative weights, a few passes over the row. A filtered row draws among its best
    `_CANDIDATES` tokens (one batched top-k of the raw logits: a temperature keeps their order),
    given their true probabilities under its temperature: its top-k set, or its nucleus, is a
    prefix of them. (Row by row, torch.multinomial over a 49k vocabulary takes ~1.7 ms, and the
    candidates' way ~0.4 ms: 26 ms of a 64-row step.)
    """
    vocab = logits.shape[1]
    ps = [params[i] for i in rows]
    u = torch.cat([torch.rand(1, generator=generators[i], dtype=torch.float64) for i in rows])
    temps = torch.tensor([p.temperature for p in ps], dtype=logits.dtype).unsqueeze(1)
    tokens = torch.zeros(len(rows), dtype=torch.long)
    plain = [j for j, p in enumerate(ps) if _plain(p, vocab)]
    filtered = [j for j, p in enumerate(ps) if not _plain(p, vocab)]
    fits = torch.zeros(len(rows), dtype=torch.bool)

    def take(js: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        at = torch.tensor(js)
        whole = len(js) == logits.shape[0] and rows == js
        return (logits if whole else logits[torch.tensor([rows[j] for j in js])]), at

    if plain:
        raw, at = take(plain)
        top = raw.amax(-1, keepdim=True)
        weights = raw - top  # the best token weighs 1
        if (temps[at] != 1.0).any():
            weights /= temps[at]
        weights.exp_()
        tokens[at] = _pick(weights, u[at])
        fits[at] = torch.isfinite(top.squeeze(1))
    if filtered:
        raw, at = take(filtered)
        count = min(_CANDIDATES, vocab)
        values, ids = torch.topk(raw, count, dim=-1)
        scaled = values / temps[at]
        ks = torch.tensor([ps[j].top_k if 0 < ps[j].top_k < vocab else vocab for j in filtered])
        within = ks <= count  # the top-k set lies inside the candidates
        # a top-k row normalizes over its own set, a nucleus of the whole vocabulary over that
        scaled = scaled.masked_fill(torch.arange(count) >= ks.unsqueeze(1), float("-inf"))
        norm = torch.logsumexp(scaled, -1)
        spill = (~within).nonzero().flatten()
        if spill.numel():
            norm[spill] = torch.logsumexp(raw[spill] / temps[at][spill], -1)
        probs = (scaled - norm.unsqueeze(1)).exp()
        # (a top_p of 1 keeps every candidate: 2 is above any mass before one)
        top_p = torch.tensor([ps[j].top_p if ps[j].top_p < 1.0 else 2.0 for j in filtered])
        keep = (probs.cumsum(-1) - probs) < top_p.unsqueeze(1)  # the nucleus: a prefix
        keep[:, 0] = True  # and the top token always (a tiny top_p is 0 in float32)
        tokens[at] = ids.gather(1, _pick(probs * keep, u[at]).unsqueeze(1)).squeeze(1)
        # a nucleus of the whole vocabulary is inside the candidates once they hold its mass
        inside = within | ((ks == vocab) & (probs.sum(-1) >= top_p))
        fits[at] = inside & torch.isfinite(norm)
    done = fits.nonzero().flatten()
    return [rows[j] for j in done.tolist()], tokens[done]


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> tuple[list[int], list[float], list[dict[int, float] | None], dict[int, Exception]]:
    """Pick one token per row of ``logits`` [N, V]; return tokens, their log-probabilities,
    for the rows whose params ask for alternatives (``logprobs`` > 0) the most likely tokens',
    and the rows that could not be sampled, with why (their token is the top one; the caller
    fails their requests): one row's failure never costs another row its token.

    Log-probabilities are those of the model's raw logits (their log-softmax), whatever the
    sampling; the CPU's rows are drawn together (`_draw_cpu`).
    Everything runs on the logits' device (``generators`` included); only the results come back,
    in one copy per call (on a GPU the rows' draws never wait for each other).
    """
    n = logits.shape[0]
    failed: dict[int, Exception] = {}
    rows: list[int] = []  # the rows drawn, their tokens in ``drawn``
    drawn: list[torch.Tensor] = []
    left = [i for i, p in enumerate(params) if not p.greedy]
    native = _native_rows(logits, params, generators)
    if native is not None:  # its picks: every finite row's greedy one, and its plain rows' draws
        picks, native_lse, drew = native
        done = (picks >= 0).tolist()
        left = [i for i in left if not (drew[i] and done[i])]
    if left and logits.device.type == "cpu":
        rows, tokens = _draw_cpu(logits, left, params, generators)
        drawn.append(tokens)
        left = sorted(set(left) - set(rows))
    for i in left:
        try:
            drawn.append(_sample_row(logits[i], params[i], generators[i]).view(1))
            rows.append(i)
        except Exception as e:  # e.g. a distribution of NaNs: this row's request fails
            failed[i] = e
    # greedy rows (and failed ones) take the first of the best, as argmax; torch's max over a
    # dim is ~3x faster on the CPU
    best = sorted(set(range(n)) - set(rows))
    picked = torch.empty(n, dtype=torch.long, device=logits.device)
    if native is not None:  # (a row that is not finite takes torch's argmax below)
        picked.copy_(picks)
        best = [i for i in best if not done[i]]
    if best:
        on = torch.tensor(best, device=logits.device)
        picked[on] = (logits if len(best) == n else logits[on]).max(dim=-1).indices
    if rows:
        picked[torch.tensor(rows, device=logits.device)] = torch.cat(drawn)
    if native is None or not all(done):
        lse = torch.logsumexp(logits, -1, keepdim=True)  # log-probabilities are logits - lse
    else:
        lse = native_lse.unsqueeze(1)
    chosen = logits.gather(1, picked.unsqueeze(1)).squeeze(1) - lse.squeeze(1)
    # one copy to the host for the whole batch (ids are exact in float64)
    both = torch.stack([picked.double(), chosen.double()]).cpu()
    tokens_out = [int(t) for t in both[0].tolist()]
    chosen_lp = both[1].tolist()
    tops: list[dict[int, float] | None] = [None] * n
    asking = [i for i, p in enumerate(params) if p.top_logprobs]
    if asking:
        at = torch.tensor(asking, device=logits.device)
        found = top_logprobs(
            logits[at] - lse[at],
            list(range(len(asking))),
            [params[i].top_logprobs for i in asking],
        )
        for i, top in zip(asking, found, strict=True):
            tops[i] = top
    return tokens_out, chosen_lp, tops, failed


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


def speculative_picks(
    logits: torch.Tensor,
    draft: tuple[int, ...],
    params: SamplingParams,
    generator: torch.Generator | None,
) -> tuple[list[int], int]:
    """Speculative sampling of a sampled request's drafted rows (``logits`` [k + 1, V], row i
    after draft token i - 1), keeping the request's distribution: draft token i, proposed with
    certainty (n-gram drafts are deterministic), is accepted with its probability under row i
    (temperature, top-k, top-p as `sample` filters), else the token is drawn from row i with
    the draft token taken out (the remainder, renormalized); after every draft is accepted, one
    more is drawn from the last row. Returns the tokens kept (the accepted drafts and the draw)
    and how many drafts were accepted; the uniforms and draws come from ``generator``."""
    rows = logits / params.temperature
    for i, token in enumerate(draft):
        probs = _filter(rows[i], params.top_k, params.top_p).softmax(-1)
        if torch.rand(1, generator=generator, dtype=torch.float64).item() < probs[token].item():
            continue
        probs[token] = 0.0  # (a token of probability 1 is always accepted)
        drawn = int(torch.multinomial(probs, 1, generator=generator))
        return [*draft[:i], drawn], i
    probs = _filter(rows[len(draft)], params.top_k, params.top_p).softmax(-1)
    return [*draft, int(torch.multinomial(probs, 1, generator=generator))], len(draft)
