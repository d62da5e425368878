"""The sampler draws from exactly the filtered distribution, by any of its paths: the CPU's
batched draw (`_draw_cpu`, which leaves some rows to the per-row one) and the per-row draw of
the whole filtered vocabulary (`_sample_row`, a GPU's)."""

from __future__ import annotations

import pytest
import torch

from chatpage.engine.sample import sampler
from chatpage.engine.sample.sampler import _filter, _sample_row, make_generator, sample
from chatpage.engine.sampling_params import SamplingParams


def _empirical(row, params, draws=4000, path="batch"):
    """How often each token of ``row`` comes up in ``draws`` draws: as rows of one batch
    (``path`` "batch") or one by one through `_sample_row` ("row")."""
    g = make_generator(0, 0)
    if path == "row":
        tokens = [int(_sample_row(row, params, g)) for _ in range(draws)]
    else:
        tokens, _, _, failed = sample(
            row.expand(draws, -1).contiguous(), [params] * draws, [g] * draws
        )
        assert not failed
    return torch.bincount(torch.tensor(tokens), minlength=row.shape[0]).float() / draws


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
@pytest.mark.parametrize("path", ["batch", "row"])
def test_draws_match_the_filtered_distribution(top_k, top_p, spread, path):
    torch.manual_seed(top_k)
    row = torch.randn(1000) * spread
    params = SamplingParams(temperature=0.7, top_k=top_k, top_p=top_p)
    expected = _filter(row / 0.7, top_k, top_p).softmax(-1)
    got = _empirical(row, params, path=path)
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
    rows = torch.randn(20, 5000)
    params = [SamplingParams(temperature=1.0, top_p=0.9)] * 20

    def draws(seed, index):
        g = make_generator(seed, index)
        return sample(rows, params, [g] * 20)[0]

    assert draws(7, 1) == draws(7, 1)
    assert draws(7, 1) != draws(7, 2)


def test_a_rows_draw_does_not_depend_on_the_rest_of_the_batch():
    """Each row draws with its own generator only: the same row and seed give the same token
    alone and among others (greedy rows, other temperatures and filters, a row that fails)."""
    torch.manual_seed(3)
    logits = torch.randn(6, 3000) * 2
    logits[4] = float("nan")
    params = [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0),
        SamplingParams(temperature=0.5, top_k=20),
        SamplingParams(temperature=1.3, top_p=0.8),
        SamplingParams(temperature=0.9),
        SamplingParams(temperature=0.6, top_k=600),  # past the candidates: drawn row by row
    ]
    together, _, _, failed = sample(logits, params, [make_generator(5, i) for i in range(6)])
    assert list(failed) == [4]
    for i in (0, 1, 2, 3, 5):
        alone, _, _, _ = sample(logits[i : i + 1], [params[i]], [make_generator(5, i)])
        assert alone == [together[i]], i


def test_a_flat_row_is_drawn_from_its_whole_vocabulary_in_proportion():
    """A flat row at temperature 1: the best `_CANDIDATES` hold about a tenth of its mass, so most
    draws land in the rest of the vocabulary, spread over it."""
    row = torch.zeros(3000)
    row[:300] = 0.05
    got = _empirical(row, SamplingParams(temperature=1.0), draws=3000)
    best = torch.topk(row, sampler._CANDIDATES).indices
    inside = row.softmax(-1)[best].sum()
    assert abs(got[best].sum() - inside) < 0.03
    assert got[300:].nonzero().numel() > 1500  # spread over the rest, not stuck on a few


def test_a_vocabulary_smaller_than_the_candidates_is_drawn_whole():
    torch.manual_seed(2)
    row = torch.randn(100)
    for params in (SamplingParams(temperature=0.8), SamplingParams(temperature=0.8, top_p=0.7)):
        expected = _filter(row / 0.8, 0, params.top_p).softmax(-1)
        assert (_empirical(row, params) - expected).abs().max() < 0.04


def test_greedy_rows_take_the_first_of_tied_best_tokens_and_its_log_probability():
    logits = torch.full((2, 600), -3.0)
    logits[0, [7, 300, 599]] = 4.0  # a three-way tie: the lowest id, as argmax picks
    logits[1, 42] = 1.0
    tokens, chosen, _, failed = sample(logits, [SamplingParams(temperature=0)] * 2, [None, None])
    assert tokens == [7, 42] and not failed
    expected = torch.log_softmax(logits, -1)[[0, 1], [7, 42]]
    assert chosen == pytest.approx(expected.tolist(), abs=1e-6)
