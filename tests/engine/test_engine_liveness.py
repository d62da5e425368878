"""Every request ends: states the engine once never came back from (issue 10, items 1-4, 6-8).

Each test drives the real engine over a tiny random Llama and bounds the number of steps, so a
hang fails the test instead of stalling the suite.
"""

from __future__ import annotations

import pytest

from chatpage.engine import EngineConfig, LLMEngine, SamplingParams
from chatpage.engine.accumulator import OutputAccumulator
from chatpage.engine.outputs import RequestOutput

BLOCK_BYTES = 16 * 2 * 2 * 2 * 64 * 4  # the tiny Llama: 2 layers, 2 KV heads of 64, fp32


def _engine(path, blocks: int, **config) -> LLMEngine:
    return LLMEngine.from_pretrained(
        str(path),
        EngineConfig(kv_cache_bytes=blocks * BLOCK_BYTES, **config),
        progress=lambda _m: None,
    )


def _drain(
    engine: LLMEngine, limit: int = 400, outputs: OutputAccumulator | None = None
) -> dict[str, RequestOutput]:
    """Step until nothing is left, folding the updates into ``outputs`` (a new accumulator by
    default); fails if that takes more than ``limit`` steps."""
    done: dict[str, RequestOutput] = {}
    outputs = outputs or OutputAccumulator()
    for _ in range(limit):
        if not engine.has_unfinished():
            return done
        for update in engine.step():
            out = outputs.add(update)
            if out.finished:
                done[out.request_id] = out
    pytest.fail(f"still unfinished after {limit} steps: {sorted(engine.groups)}")


def _assert_no_leak(engine: LLMEngine) -> None:
    s = engine.stats()
    assert s.blocks_used == s.blocks_pinned, "blocks still held after every request finished"
    assert s.blocks_swapped == 0


def _greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


def test_beam_search_ends_when_every_candidate_is_an_end_token(tiny_llama_dir):
    engine = _engine(tiny_llama_dir, 32)
    every_token = list(range(engine.model.vocab_size))
    rid = engine.add_request(
        [5, 6, 7, 8], SamplingParams(beam_width=2, max_tokens=8, stop_token_ids=every_token)
    )
    out = _drain(engine, limit=10)[rid]
    assert [len(c.token_ids) for c in out.outputs] == [1, 1]
    assert all(c.finish_reason == "stop" for c in out.outputs)
    _assert_no_leak(engine)


def test_request_wider_than_max_num_seqs_is_refused(tiny_llama_dir):
    engine = _engine(tiny_llama_dir, 32, max_num_seqs=2)
    with pytest.raises(ValueError, match=r"3 sequences .* max_num_seqs=2"):
        engine.add_request([5, 6, 7], SamplingParams(n=3, max_tokens=4))
    with pytest.raises(ValueError, match=r"4 sequences .* max_num_seqs=2"):
        engine.add_request([5, 6, 7], SamplingParams(beam_width=4, max_tokens=4))
    assert not engine.has_unfinished()


def test_swapped_group_comes_back_after_its_prefix_is_pinned(tiny_llama_dir):
    """A group that shares a prefix is swapped out; the prefix gets pinned while it is out."""
    engine = _engine(tiny_llama_dir, 12, preemption_mode="swap")
    prefix = list(range(100, 164))  # 4 full blocks
    owner = engine.add_request(prefix, _greedy(60), pin_prefix=True)
    engine.step()
    engine.step()  # (the prompt's last block is a chunk of its own)
    sharer = engine.add_request(prefix + list(range(300, 330)), _greedy(90))
    done: dict[str, RequestOutput] = {}
    outputs = OutputAccumulator()
    for _ in range(200):
        done.update({o.request_id: o for o in map(outputs.add, engine.step()) if o.finished})
        if owner in done:
            break
    assert engine.groups[sharer].status.name == "SWAPPED"
    assert engine.stats().blocks_pinned == 4
    # an innocent request arriving now must not be failed for the swapped group's sake
    later = engine.add_request([5, 6, 7], _greedy(3))
    done.update(_drain(engine, limit=200, outputs=outputs))
    assert done[later].error is None and len(done[later].outputs[0].token_ids) == 3
    assert done[sharer].error is None and len(done[sharer].outputs[0].token_ids) == 90
    _assert_no_leak(engine)


def test_swap_shares_blocks_held_by_others_instead_of_copying_them(tiny_llama_dir):
    engine = _engine(tiny_llama_dir, 12, preemption_mode="swap")
    prefix = list(range(100, 164))
    engine.add_request(prefix, _greedy(60), pin_prefix=True)
    engine.step()
    engine.step()  # (the prompt's last block is a chunk of its own)
    sharer = engine.add_request(prefix + list(range(300, 330)), _greedy(90))
    for _ in range(100):
        engine.step()
        if engine.groups[sharer].status.name == "SWAPPED":
            break
    table = engine.bm.tables[engine.groups[sharer].seqs[0].seq_id]
    # the 4 prefix blocks are also held by their owner: they stay on the device
    assert engine.stats().blocks_swapped == len(table) - 4
    _drain(engine)
    _assert_no_leak(engine)


def test_swap_in_resumes_a_chunked_prefill(tiny_llama_dir):
    engine = _engine(
        tiny_llama_dir,
        12,
        preemption_mode="swap",
        max_num_batched_tokens=32,
        enable_prefix_caching=False,
    )
    first = engine.add_request(list(range(100, 193)), _greedy(30))
    for _ in range(4):
        engine.step()
    second = engine.add_request(list(range(300, 440)), _greedy(20))
    engine.step()
    engine.step()
    engine.step()
    group = engine.groups[second]
    assert group.status.name == "SWAPPED" and group.seqs[0].num_computed_tokens < 140
    done = _drain(engine, limit=200)  # (the steps above sent some of their tokens already)
    assert done[first].usage.completion_tokens == 30
    assert done[second].usage.completion_tokens == 20
    _assert_no_leak(engine)


def test_unpin_before_the_pinning_request_finished_releases_the_prefix(tiny_llama_dir):
    engine = _engine(tiny_llama_dir, 32)
    rid = engine.pin_prefix(list(range(100, 164)))
    engine.unpin_prefix(rid)
    _drain(engine)
    assert engine.stats().blocks_pinned == 0
    _assert_no_leak(engine)
    # and after it finished, unpin releases it as before
    rid = engine.pin_prefix(list(range(100, 164)))
    _drain(engine)
    assert engine.stats().blocks_pinned == 4
    engine.unpin_prefix(rid)
    assert engine.stats().blocks_pinned == 0


def test_generate_withdraws_its_requests_when_a_later_prompt_is_refused(tiny_llama_dir):
    engine = _engine(tiny_llama_dir, 32)
    with pytest.raises(ValueError, match="the prompt is empty"):
        engine.generate([[5, 6, 7], [8, 9], []], _greedy(4))
    assert not engine.has_unfinished()
    _assert_no_leak(engine)


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_a_request_squeezed_out_by_a_later_pin_fails_itself_clearly(tiny_llama_dir, mode):
    engine = _engine(tiny_llama_dir, 12, preemption_mode=mode)
    grower = engine.add_request(list(range(100, 116)), _greedy(150))  # 11 blocks at its longest
    engine.step()
    engine.pin_prefix(list(range(200, 248)))  # 3 blocks pinned from now on: 9 left
    done = _drain(engine, limit=300)
    assert engine.stats().blocks_pinned == 3
    assert "does not fit in the KV cache next to the pinned prefixes" in done[grower].error
    later = engine.generate([[5, 6, 7]], _greedy(3))[0]
    assert later.error is None and len(later.outputs[0].token_ids) == 3
    _assert_no_leak(engine)
