"""The soak (chatpage/bench/soak.py) at test size: 2,100 mixed requests, 700 in each preemption
mode, through pools of 12-24 blocks, some with sampling values at the edge of the float range;
consistency is audited after every step."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from chatpage.bench import soak, soak_serve


@pytest.mark.slow  # runs a benchmark end to end
def test_every_request_ends_and_no_block_leaks(default_model_dir):
    loaded = soak.tiny_model(AutoTokenizer.from_pretrained(default_model_dir))
    result = soak.run(loaded, requests=2100, seed=0)
    assert result["problems"] == [], result
    assert result["requests"] == 2100
    assert result["hung"] == 0 and result["leaked_blocks"] == 0, result
    assert result["errored"] == 0 and result["failed_by_others"] == 0, result["errors"]
    assert result["extreme"] >= 50  # (about one in twenty)
    # refused at add_request (too big next to the pinned prefixes of the moment): a few
    assert result["rejected"] <= 21
    assert result["finished"] + result["aborted"] + result["rejected"] == 2100
    assert result["aborted"] > 0
    assert result["greedy_checked"] == 3 * soak.GREEDY_CHECKS
    assert result["greedy_mismatches"] == 0
    # every mode was pushed into preemption, and swapping and recomputing both happened
    assert all(sum(p.values()) > 0 for p in result["preemptions"].values())
    assert result["preemptions"]["swap"]["swap"] > 0
    assert result["preemptions"]["recompute"]["recompute"] > 0
    serve = result["serve"]
    assert serve["requests"] == 105 and serve["hostile"] > 0
    assert serve["hostile_not_refused"] == 0 and serve["failed_by_others"] == 0, serve


@pytest.mark.slow  # runs a benchmark end to end
def test_hostile_requests_through_serve_are_refused_and_fail_no_other(default_model_dir):
    """Huge and odd logit_bias keys, a schema too big to compile soon, n x max_tokens x
    top_logprobs past its cap and a foreign Host, among ordinary requests (issue 40)."""
    loaded = soak.tiny_model(AutoTokenizer.from_pretrained(default_model_dir))
    result = soak_serve.run(loaded, requests=64, seed=1)
    assert result["hostile"] >= 8, result
    assert result["hostile_not_refused"] == 0 and result["failed_by_others"] == 0, result
