"""The engine on a GPU end to end: the device choice, weights streamed onto it, the KV pool sized
from its memory, torch's CUDA int4 matmul, CUDA graphs, swapping and forks, seeded sampling, and
greedy equivalence with the CPU path (scripts/gpu_check.sh runs these first)."""

from __future__ import annotations

import gc

import pytest
import torch

from chatpage.engine import EngineConfig, LLMEngine, SamplingParams
from chatpage.engine.accumulator import OutputAccumulator
from chatpage.engine.device import plan_engine, probe_cuda, resolve_device
from chatpage.engine.load.dequant import IQ4_LEVELS
from chatpage.engine.load.loader import load_model
from chatpage.engine.load.stream import StreamedState
from chatpage.engine.model.gemv import reference_int4
from chatpage.engine.model.weights import cuda_linear, pack_int4, quantize_int4

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SHARE = 0.2  # of the card per engine: the tests' engines live one at a time
PROMPTS = [list(range(40, 95)), [5, 6, 7, 8, 9], list(range(300, 317)), list(range(1000, 1040))]
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def _engine(model_dir, **config) -> LLMEngine:
    config.setdefault("gpu_memory_utilization", SHARE)
    return LLMEngine.from_pretrained(
        str(model_dir), EngineConfig(**config), progress=lambda _m: None
    )


def _tokens(engine: LLMEngine, params: SamplingParams = GREEDY) -> list[list[int]]:
    out = [o.outputs[0].token_ids for o in engine.generate(PROMPTS, params)]
    del engine
    _free()
    return out


def _free() -> None:
    """Give a dropped engine's GPU memory back, so that the next one sizes its pool from it."""
    gc.collect()
    torch.cuda.empty_cache()


def test_auto_runs_on_the_first_gpu():
    report = probe_cuda()
    assert report.cuda_build and report.driver and report.gpus
    assert resolve_device("auto", report).device == "cuda:0"
    plan = plan_engine("auto", "auto", "int4", report)
    assert (plan.device, plan.dtype, plan.kv_dtype) == ("cuda:0", "float32", "bfloat16")
    assert plan.weights == "int4"


def test_greedy_matches_the_cpu_in_fp32(gpu_tiny_dir):
    cpu = _tokens(_engine(gpu_tiny_dir, device="cpu"))
    gpu = _tokens(_engine(gpu_tiny_dir, device="cuda", dtype="float32"))
    assert gpu == cpu


def test_bf16_engine_on_the_gpu(gpu_tiny_dir):
    engine = _engine(gpu_tiny_dir, device="cuda", dtype="auto", weight_dtype="bf16")
    assert engine.kv.k[0].device.type == "cuda" and engine.kv.k[0].dtype == torch.bfloat16
    assert engine.kv.cpu_k[0].is_pinned()
    assert engine.model.fused.native  # the fused CUDA ops over the fp32 residual stream
    graphs = engine.runner.graphs
    assert graphs is not None
    with_graphs = [o.outputs[0].token_ids for o in engine.generate(PROMPTS, GREEDY)]
    assert graphs.enabled and 4 in graphs.captured  # the decode steps replayed a graph
    del engine, graphs
    _free()
    eager = _tokens(
        _engine(gpu_tiny_dir, device="cuda", dtype="auto", weight_dtype="bf16", cuda_graphs=False)
    )
    assert with_graphs == eager
    cpu = _tokens(_engine(gpu_tiny_dir, device="cpu"))
    assert [t[0] for t in with_graphs] == [t[0] for t in cpu]  # bf16: the first tokens agree


def test_int8_kv_engine_on_the_gpu(gpu_tiny_dir):
    """An int8 KV cache on the GPU: its pool holds int8 rows with their scales, decode steps
    replay CUDA graphs over it, and greedy tokens are the CPU's int8 engine's (fp32 otherwise)."""
    engine = _engine(gpu_tiny_dir, device="cuda", dtype="float32", kv_cache_dtype="int8")
    assert engine.kv.k[0].dtype == torch.int8 and engine.kv.format.dtype == "int8"
    assert engine.int8_kv_loss.acceptable
    graphs = engine.runner.graphs
    gpu = [o.outputs[0].token_ids for o in engine.generate(PROMPTS, GREEDY)]
    assert graphs is not None and graphs.captured
    del engine, graphs
    _free()
    cpu = _tokens(_engine(gpu_tiny_dir, device="cpu", kv_cache_dtype="int8"))
    assert gpu == cpu


def test_the_kv_pool_takes_the_share_of_the_gpu(gpu_tiny_dir):
    engine = _engine(gpu_tiny_dir, device="cuda", dtype="auto", weight_dtype="bf16")
    _, total = torch.cuda.mem_get_info()
    pool = engine.stats().num_blocks * engine.block_bytes
    assert engine.stats().device == "cuda:0"
    assert 0.5 * SHARE * total < pool <= SHARE * total  # the tiny weights take next to nothing
    del engine
    _free()


def test_swapping_forks_and_beams_on_the_gpu(gpu_tiny_dir):
    def run(device: str) -> dict[str, list[list[int]]]:
        engine = _engine(
            gpu_tiny_dir,
            device=device,
            dtype="float32",
            gpu_blocks=12,
            kv_cache_bytes=12 * 16 * 2 * 2 * 2 * 64 * 4,
            preemption_mode="swap",
            max_num_batched_tokens=48,
        )
        groups = {
            "greedy": engine.add_request(list(range(100, 190)), GREEDY),
            "n": engine.add_request(
                list(range(30, 51)), SamplingParams(n=3, seed=3, max_tokens=10)
            ),
            "beam": engine.add_request(
                list(range(60, 80)), SamplingParams(beam_width=3, max_tokens=8)
            ),
        }
        done = {}
        acc = OutputAccumulator()
        while engine.has_unfinished():
            for update in engine.step():
                out = acc.add(update)
                if out.finished:
                    done[out.request_id] = out
        assert device == "cpu" or engine.stats().preemptions_swap > 0
        del engine
        _free()
        return {k: [c.token_ids for c in done[rid].outputs] for k, rid in groups.items()}

    gpu, cpu = run("cuda"), run("cpu")
    assert gpu["greedy"] == cpu["greedy"] and gpu["beam"] == cpu["beam"]
    assert [len(t) for t in gpu["n"]] == [10, 10, 10]


def test_seeded_sampling_repeats_on_the_gpu(gpu_tiny_dir):
    params = SamplingParams(temperature=0.9, top_p=0.9, top_k=50, seed=7, max_tokens=16)
    a = _tokens(_engine(gpu_tiny_dir, device="cuda", dtype="auto", weight_dtype="bf16"), params)
    b = _tokens(_engine(gpu_tiny_dir, device="cuda", dtype="auto", weight_dtype="bf16"), params)
    assert a == b


def test_dense_weights_stream_onto_the_gpu(gpu_tiny_dir):
    loaded = load_model(
        str(gpu_tiny_dir), lambda _m: None, "bf16", torch.device("cuda"), torch.float32
    )
    assert isinstance(loaded.state, StreamedState)
    q = loaded.state["model.layers.0.self_attn.q_proj.weight"]
    norm = loaded.state["model.layers.0.input_layernorm.weight"]
    assert (q.device.type, q.dtype, norm.dtype) == ("cuda", torch.bfloat16, torch.float32)


@pytest.mark.parametrize("levels", [False, True])  # True: IQ4_NL's, dequantized on the GPU
@pytest.mark.parametrize(("rows", "n", "k"), [(1, 256, 576), (7, 1536, 576), (64, 512, 4096)])
def test_int4_through_torchs_cuda_matmul(rows, n, k, levels):
    torch.manual_seed(rows)
    packed = pack_int4(*quantize_int4(torch.randn(n, k)), "w")
    if levels:
        packed["w.levels"] = torch.tensor(IQ4_LEVELS, dtype=torch.int8)
        packed["w.scales"] = (packed["w.scales"].float() / 16).to(torch.bfloat16)
    linear = cuda_linear(packed, "w", torch.device("cuda"), torch.bfloat16)
    x = torch.randn(rows, k).to(torch.bfloat16)
    parts = (packed.get("w." + p) for p in ("q4", "scales", "zeros", "levels"))
    want = reference_int4(x.float(), *parts, None)
    got = linear(x.cuda()).float().cpu()
    assert torch.allclose(got, want, rtol=2e-2, atol=2e-1 * want.abs().mean().item())


def test_int4_engine_on_the_gpu(gpu_tiny_dir):
    """The app's default format on a GPU: int4 layers through torch's CUDA int4 matmul and the
    int8 lm_head (through torch's CUDA int8 kernel, or dequantized where there is none)."""
    engine = _engine(gpu_tiny_dir, device="cuda", dtype="auto", weight_dtype="int4")
    assert engine.plan.weights == "int4" and not engine.plan.notes
    gpu = _tokens(engine)
    cpu = _tokens(_engine(gpu_tiny_dir, device="cpu", weight_dtype="int4"))
    assert [t[0] for t in gpu] == [t[0] for t in cpu]


def test_the_kv_disk_tier_on_the_gpu(gpu_tiny_dir, tmp_path):
    """A bf16 pool's blocks go down to disk and come back into a restarted engine's pool: the
    same greedy tokens as the engine that computed them, every full block read back."""
    config = dict(device="cuda", dtype="auto", kv_disk_bytes=1 << 30, kv_disk_dir=str(tmp_path))
    cold = _engine(gpu_tiny_dir, **config)
    first = [o.outputs[0].token_ids for o in cold.generate(PROMPTS, GREEDY)]
    cold.close()
    del cold
    _free()
    warm = _engine(gpu_tiny_dir, **config)
    again = [o.outputs[0].token_ids for o in warm.generate(PROMPTS, GREEDY)]
    assert again == first
    assert warm.bm.tier_hit_tokens == sum((len(p) - 1) // 16 * 16 for p in PROMPTS)
    assert warm.bm.audit() == []
    warm.close()
