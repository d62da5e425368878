"""The sampler draws from exactly the filtered distribution, by any of its paths."""

from __future__ import annotations

import pytest
import torch

from chatpage.engine.sampler import _filter, _sample_row, make_generator, sample
from chatpage.engine.sampling_params import SamplingParams


def _empirical(row, params, draws=4000):
    g = make_generator(0, 0)
    counts = torch.zeros_like(row)
    for _ in range(draws):
        counts[_sample_row(row, params, g)] += 1
    return counts / draws


@pytest.mark.parametrize(
    "top_k,top_p,spread",
    [
        (0, 1.0, 1.0),  # plain temperature over the whole vocabulary (the best 256, or the rest)
        (0, 1.0, 3.0),  # the same, peaked: mostly the best 256
        (5, 1.0, 1.0),  # top-k inside the candidate window
        (0, 0.9, 3.0),  # a peaked distribution: the nucleus is inside the window
        (0, 0.95, 0.01),  # a flat one: the nucleus spills past the window (full-vocabulary path)
        (400, 0.5, 0.01),  # top-k larger than the window
        (3, 0.6, 1.0),  # both
    ],
)
def test_sample_row_matches_the_filtered_distribution(top_k, top_p, spread):
    torch.manual_seed(top_k)
    row = torch.randn(1000) * spread
    params = SamplingParams(temperature=0.7, top_k=top_k, top_p=top_p)
    expected = _filter(row / 0.7, top_k, top_p).softmax(-1)
    got = _empirical(row, params)
    assert set(got.nonzero().flatten().tolist()) <= set(expected.nonzero().flatten().tolist())
    assert (got - expected).abs().max() < 0.04


def test_the_whole_vocabulary_is_drawn_from_in_the_right_proportion_inside_and_outside_the_best():
    """The full-vocabulary draw first chooses between the best 256 tokens and the rest by their
    mass: both halves come up as often as their probability says."""
    torch.manual_seed(1)
    row = torch.randn(2000)
    got = _empirical(row, SamplingParams(temperature=1.0), draws=6000)
    best = torch.topk(row, 256).indices
    inside = row.softmax(-1)[best].sum()
    assert 0.3 < inside < 0.7  # both halves matter here
    assert abs(got[best].sum() - inside) < 0.02


def test_same_seed_same_draws():
    row = torch.randn(5000)
    params = SamplingParams(temperature=1.0, top_p=0.9)
    g1, g2 = make_generator(7, 1), make_generator(7, 1)
    assert [_sample_row(row, params, g1) for _ in range(20)] == [
        _sample_row(row, params, g2) for _ in range(20)
    ]
    g1, g2 = make_generator(7, 1), make_generator(7, 2)
    assert [_sample_row(row, params, g1) for _ in range(20)] != [
        _sample_row(row, params, g2) for _ in range(20)
    ]


def test_greedy_rows_take_the_first_of_tied_best_tokens_and_its_log_probability():
    logits = torch.full((2, 600), -3.0)
    logits[0, [7, 300, 599]] = 4.0  # a three-way tie: the lowest id, as argmax picks
    logits[1, 42] = 1.0
    tokens, chosen, _, failed = sample(logits, [SamplingParams(temperature=0)] * 2, [None, None])
    assert tokens == [7, 42] and not failed
    expected = torch.log_softmax(logits, -1)[[0, 1], [7, 42]]
    assert chosen == pytest.approx(expected.tolist(), abs=1e-6)
