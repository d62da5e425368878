"""The CUDA-graph bookkeeping of decode steps (chatpage/engine/model/cuda_graphs.py) on the CPU: bucket
choice, the static buffers (reused, padded), recapture when the KV cache changes, the fall back to
eager steps; and an engine replaying its decode steps through it generates what an eager one does.
The capture here replays by running the forward again over the same buffers (torch.cuda.graph
itself needs a GPU)."""

from __future__ import annotations

import torch

from chatpage.engine import EngineConfig, LLMEngine, SamplingParams
from chatpage.engine.model.cuda_graphs import DecodeGraphs, GraphPlan, StaticInputs


class EagerCapture:
    """A capture that 'replays' by running the forward again; counts its captures."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def __call__(self, forward, inputs: StaticInputs, pool):
        self.sizes.append(inputs.input_ids.shape[0])
        logits = forward(inputs)
        return (lambda: logits.copy_(forward(inputs))), logits, pool


def test_buckets_cover_a_batch_with_the_smallest_size_that_holds_it():
    plan = GraphPlan(max_batch=6, max_blocks=4, block_size=16, buckets=(8, 1, 2, 4))
    assert plan.buckets == (1, 2, 4)  # sorted; 8 is above the largest batch
    assert [plan.bucket(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 4, 4, None]
    assert plan.fits(3, 4) and not plan.fits(3, 5) and not plan.fits(5, 1) and not plan.fits(0, 1)


def test_a_batch_is_padded_into_the_same_buffers_every_step():
    plan = GraphPlan(max_batch=4, max_blocks=3, block_size=4, buckets=(2, 4))
    before = plan.inputs(4)
    size = plan.fill([11, 12, 13], [5, 0, 9], [[7, 8], [3], [1, 2, 6]])
    assert size == 4
    got = plan.inputs(4)
    assert got.input_ids.data_ptr() == before.input_ids.data_ptr()  # one memory for every step
    assert got.input_ids.tolist() == [11, 12, 13, 0]
    assert got.positions.tolist() == [5, 0, 9, 0]
    # slot = block of the position * block size + offset; a padded row stores nothing
    assert got.slot_mapping.tolist() == [8 * 4 + 1, 3 * 4 + 0, 6 * 4 + 1, -1]
    assert got.block_tables.tolist() == [[7, 8, 0], [3, 0, 0], [1, 2, 6], [0, 0, 0]]
    assert got.seq_lens.tolist() == [6, 1, 10, 1]
    assert got.query_start_loc.tolist() == [0, 1, 2, 3, 4]
    assert got.logit_rows.tolist() == [0, 1, 2, 3]
    assert plan.fill([21], [2], [[4]]) == 2  # a smaller batch: the bucket's prefix of the buffers
    assert plan.inputs(2).slot_mapping.tolist() == [4 * 4 + 2, -1]
    assert plan.inputs(2).block_tables.data_ptr() == before.block_tables.data_ptr()


def _graphs(capture, forward=None, warnings=None):
    plan = GraphPlan(max_batch=4, max_blocks=2, block_size=4, buckets=(1, 2, 4))
    calls = []

    def run_model(inputs: StaticInputs) -> torch.Tensor:
        calls.append(inputs.input_ids.shape[0])
        return inputs.input_ids.float().unsqueeze(1) * 2

    graphs = DecodeGraphs(
        plan, forward or run_model, (warnings if warnings is not None else []).append, capture
    )
    return graphs, calls


def test_graphs_are_captured_once_per_bucket_and_again_for_a_new_cache():
    capture = EagerCapture()
    graphs, _ = _graphs(capture)
    out = graphs.run([3, 4, 5], [0, 1, 2], [[0], [1], [1]], key="cache A")
    assert out.squeeze(1).tolist() == [6, 8, 10]  # the real rows only
    assert graphs.run([6, 7, 1], [0, 1, 2], [[0], [1], [1]], key="cache A").squeeze(1).tolist() == [
        12,
        14,
        2,
    ]  # replayed over the new contents
    graphs.run([9], [0], [[0]], key="cache A")
    assert capture.sizes == [4, 1] and graphs.captured == (1, 4)
    graphs.run([9], [0], [[0]], key="cache B")  # another KV cache: the graphs point at the old one
    assert capture.sizes == [4, 1, 1] and graphs.captured == (1,)
    graphs.invalidate()
    assert graphs.captured == ()


def test_batches_that_do_not_fit_run_eagerly():
    capture = EagerCapture()
    graphs, _ = _graphs(capture)
    assert graphs.run([1] * 5, [0] * 5, [[0]] * 5, key=0) is None  # above the largest bucket
    assert graphs.run([1], [9], [[0, 1, 2]], key=0) is None  # a table wider than the buffers
    assert capture.sizes == []


def test_a_failed_capture_turns_graphs_off_with_a_warning():
    warnings: list[str] = []

    def failing(forward, inputs, pool):
        raise RuntimeError("operation not permitted when stream is capturing\nmore")

    graphs, _ = _graphs(failing, warnings=warnings)
    assert graphs.run([1], [0], [[0]], key=0) is None
    assert not graphs.enabled
    assert warnings == [
        "CUDA graphs are off (capture failed: operation not permitted when stream is capturing)"
    ]
    assert graphs.run([1], [0], [[0]], key=0) is None


def test_an_engine_replaying_decode_steps_generates_what_an_eager_one_does(tiny_llama_dir):
    prompts = ["The lighthouse keeper", "Once upon a time there", "def add(a, b):"]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    results = []
    for graphed in (False, True):
        engine = LLMEngine.from_pretrained(
            str(tiny_llama_dir), EngineConfig(), progress=lambda _m: None
        )
        capture = EagerCapture()
        if graphed:
            engine.runner.use_graphs(capture)
        outs = engine.generate(prompts, params)
        results.append([o.outputs[0].token_ids for o in outs])
    assert results[0] == results[1]
    assert capture.sizes == [4]  # three decode rows, padded to 4, captured once for every step
