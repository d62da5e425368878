"""The native sampling pass (csrc/cpu/sample.cpp) on this machine's build and on the AVX2 build,
and the sampler taking it for the CPU's rows."""

from __future__ import annotations

import pytest
import torch
from kernel_checks import run_other_build
from sample_checks import CHECKS

from chatpage.engine.model import ops
from chatpage.engine.sample.sampler import sample
from chatpage.engine.sampling_params import SamplingParams


@pytest.fixture(autouse=True)
def _kernels():
    assert ops.load()


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__)
def test_sample_rows_matches_the_torch_code(check):
    check()


@pytest.mark.slow  # the kernels built for another ISA, run in a process of their own
def test_the_avx2_build_matches_too():
    assert run_other_build("sample_checks.py")[-2:] == [str(len(CHECKS)), "passed"]


def test_bad_arguments_are_refused():
    lib = torch.ops.chatpage
    x, t, u = torch.zeros(2, 8), torch.zeros(2), torch.zeros(2, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="logits must be a contiguous float32"):
        lib.sample_rows(x.double(), t, u)
    with pytest.raises(RuntimeError, match="temperatures must be float32 with one value per row"):
        lib.sample_rows(x, torch.zeros(3), u)
    with pytest.raises(RuntimeError, match="uniforms must be float64 with one value per row"):
        lib.sample_rows(x, t, u.float())
    with pytest.raises(RuntimeError, match="the vocabulary is empty"):
        lib.sample_rows(torch.zeros(2, 0), t, u)


def test_the_sampler_takes_the_native_pass_for_plain_and_greedy_rows(monkeypatch):
    """Plain sampled rows and greedy rows come from sample_rows (its picks, its logsumexp); a
    top-p row still takes the candidates' way; the same seeds give the same draws."""
    calls = []
    real = torch.ops.chatpage.sample_rows
    monkeypatch.setattr(
        torch.ops.chatpage, "sample_rows", lambda *a: calls.append(a[1].tolist()) or real(*a)
    )
    torch.manual_seed(0)
    logits = torch.randn(3, 500) * 3
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.8, seed=1),
        SamplingParams(temperature=0.8, top_p=0.5, seed=2),
    ]

    def run():
        gens = [None] + [torch.Generator().manual_seed(s) for s in (1, 2)]
        return sample(logits, params, gens)

    tokens, logprobs, _, failed = run()
    assert calls == [pytest.approx([0.0, 0.8, 0.0])] and failed == {}
    assert tokens[0] == int(logits[0].argmax())
    lp = torch.log_softmax(logits, -1)
    assert logprobs == pytest.approx([float(lp[i, t]) for i, t in enumerate(tokens)], abs=1e-5)
    assert run()[0] == tokens
