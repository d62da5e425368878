"""Speculative sampling keeps the distribution (engine/sample/sampler.py's speculative_picks):
a drafted token is accepted with its probability, else the token is drawn from the rest."""

from __future__ import annotations

import pytest
import torch

from chatpage.engine import SamplingParams
from chatpage.engine.sample.sampler import _filter, speculative_picks

DRAWS = 20000


def _frequencies(tokens: list[int], vocab: int) -> torch.Tensor:
    return torch.bincount(torch.tensor(tokens, dtype=torch.long), minlength=vocab).double()


@pytest.mark.slow
@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7, top_k=4),
        SamplingParams(temperature=1.3, top_p=0.8),
    ],
    ids=["plain", "top-k", "top-p"],
)
def test_the_first_token_and_the_next_follow_the_target_distribution(params):
    """Over many draws the first token is distributed as row 0 says, whatever the draft, and
    the token after an accepted draft as row 1 says (each within 4.5 standard errors)."""
    torch.manual_seed(0)
    vocab = 6
    logits = torch.randn(3, vocab) * 1.5
    want = [
        _filter(row / params.temperature, params.top_k, params.top_p).softmax(-1) for row in logits
    ]
    draft = (int(want[0].argsort()[-2]), int(want[1].argmax()))  # (a likely, not the likeliest)
    gen = torch.Generator().manual_seed(1)
    firsts, seconds, accepted = [], [], 0
    for _ in range(DRAWS):
        picked, kept = speculative_picks(logits, draft, params, gen)
        assert picked[:kept] == list(draft[:kept]) and len(picked) == kept + 1
        firsts.append(picked[0])
        if picked[0] == draft[0]:
            seconds.append(picked[1])
        accepted += kept
    assert 0 < accepted < 2 * DRAWS
    for got, p, n in ((firsts, want[0], DRAWS), (seconds, want[1], len(seconds))):
        freq = _frequencies(got, vocab) / n
        err = (p.double() * (1 - p.double()) / n).sqrt()
        assert ((freq - p.double()).abs() <= 4.5 * err + 1e-9).all(), (freq, p)


def test_the_same_generator_draws_the_same():
    logits = torch.randn(4, 50)
    params = SamplingParams(temperature=0.9, seed=3)
    runs = [
        speculative_picks(logits, (1, 2, 3), params, torch.Generator().manual_seed(5))
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
