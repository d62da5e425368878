"""torch.ops.chatpage.sample_rows and forbid_tokens (csrc/cpu/sample.cpp) against the sampler's
and the constraints' torch code (chatpage/engine/sample/), shared by
tests/kernels/test_sample_rows.py's in-process tests (this machine's build) and its AVX2 build,
which runs this file as a script in a process of its own: ``python tests/sample_checks.py
CACHE_DIR BUILD`` prints how many checks passed."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

from chatpage.engine.model import ops

NEG = float("-inf")


def rows_of(*values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def call(logits: torch.Tensor, temps: list[float], uniforms: list[float]):
    return torch.ops.chatpage.sample_rows(
        logits.contiguous(), torch.tensor(temps), torch.tensor(uniforms, dtype=torch.float64)
    )


def check_greedy_and_lse() -> None:
    """Greedy rows: the first of tied best logits, and the row's logsumexp (masked logits,
    vocabularies that are and are not multiples of the eight lanes)."""
    torch.manual_seed(0)
    for vocab in (1, 7, 8, 45, 49152):
        x = torch.randn(5, vocab) * 4
        x[1, :: max(1, vocab // 5)] = NEG
        x[1, 0] = 3.0
        x[2, vocab // 2 :] = x[2].max() + 1  # ties: the first one wins
        picks, lse = call(x, [0.0] * 5, [0.0] * 5)
        assert picks.tolist() == x.max(dim=-1).indices.tolist(), vocab
        torch.testing.assert_close(lse, torch.logsumexp(x, -1), rtol=1e-5, atol=1e-5)


def check_draws_land_where_the_cumulative_weights_say() -> None:
    """A draw takes the token whose span of the laid-out weights u * W falls in: weights 1, 2,
    3, 4 on tokens 3, 9, 17 and 30 of 40 (the rest masked), across groups of eight."""
    x = torch.full((1, 40), NEG)
    for token, weight in ((3, 1.0), (9, 2.0), (17, 3.0), (30, 4.0)):
        x[0, token] = math.log(weight)
    want = {0.05: 3, 0.15: 9, 0.35: 17, 0.59: 17, 0.61: 30, 0.999: 30}
    for u, token in want.items():
        picks, lse = call(x, [1.0], [u])
        assert picks.tolist() == [token], (u, picks)
        torch.testing.assert_close(lse, torch.tensor([math.log(10.0)]))
    # at temperature 2 the weights are their square roots: 1, 1.41, 1.73, 2 (total 6.15)
    assert call(x, [2.0], [0.5])[0].tolist() == [17]  # 3.06 lies in 17's span (2.41, 4.15]
    # an infinite temperature weighs the unmasked tokens alike and never draws a masked one
    seen = {call(x, [math.inf], [u / 10 + 0.01])[0].item() for u in range(10)}
    assert seen == {3, 9, 17, 30}


def check_rows_that_are_not_finite() -> None:
    """A row with a NaN or an infinite logit gets -1 (the torch code takes it); the others in
    the same call are unaffected."""
    x = torch.randn(4, 20)
    x[1, 5] = float("nan")
    x[2, 7] = float("inf")
    x[3] = NEG
    picks, _ = call(x, [1.0, 1.0, 0.0, 0.0], [0.5] * 4)
    assert picks[1:].tolist() == [-1, -1, -1] and 0 <= picks[0] < 20


def check_forbid_tokens_masks_as_the_reference() -> None:
    """torch.ops.chatpage.forbid_tokens against constraints.forbid: random words, words of all
    ones (skipped) and of zeros, vocabularies that are not a multiple of 32 (the last word's high
    bits past the vocabulary), a bitmask wider than the rows need, and logits already -inf."""
    from chatpage.engine.sample.constraints import forbid

    gen = torch.Generator().manual_seed(1)
    for vocab, words in ((31, 1), (1000, 32), (1000, 40), (49152, 1536)):
        bitmask = torch.randint(-(2**31), 2**31 - 1, (4, words), dtype=torch.int32, generator=gen)
        bitmask[1] = -1  # every token allowed
        bitmask[2, : words // 2] = 0  # the first half forbidden
        logits = torch.randn(4, vocab, generator=gen)
        logits[3, :3] = NEG
        want = logits.clone()
        forbid(want, bitmask[:, : (vocab + 31) // 32], vocab)
        torch.ops.chatpage.forbid_tokens(logits, bitmask)
        assert torch.equal(logits, want), vocab


CHECKS = [
    check_greedy_and_lse,
    check_draws_land_where_the_cumulative_weights_say,
    check_rows_that_are_not_finite,
    check_forbid_tokens_masks_as_the_reference,
]


def main(cache_dir: Path, build: str) -> None:
    loader = ops.KernelLoader(cache_dir=cache_dir, cflags=ops.TEST_BUILDS[build])
    assert loader.load(), loader.status()
    for check in CHECKS:
        check()
    print(f"{len(CHECKS)} passed")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
