"""Every tensor of an engine step lives on the engine's device (issue 10), proven without a GPU.

The engine runs with ``EngineConfig(device="meta")`` under a dispatch mode that stands in for an
accelerator: tensors created on "meta" (or moved there) are real CPU tensors wrapped as device
tensors, and any op that mixes a host tensor (anything but a 0-dim scalar) with device tensors
fails, as it would on CUDA. Generators are recorded with the device they were made for, and a
sampling op on device tensors must use a generator of that device. Results come back to the host
only by an explicit ``.cpu()``.
"""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from chatpage.engine import EngineConfig, LLMEngine, SamplingParams
from chatpage.engine.accumulator import OutputAccumulator

FAKE = torch.device("meta")
BLOCK_BYTES = 16 * 2 * 2 * 2 * 64 * 4  # the tiny Llama: 2 layers, 2 KV heads of 64, fp32


# a value of a device tensor read on the host (int(), .item(), a branch on it) or a boolean index
# (its size depends on the data): each one waits for the device
WAITING_OPS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default)


class DeviceMismatch(AssertionError):
    pass


class OnDevice(torch.Tensor):
    """A CPU tensor presented as living on the fake device."""

    @staticmethod
    def __new__(cls, inner: torch.Tensor):
        return torch.Tensor._make_wrapper_subclass(
            cls,
            inner.shape,
            strides=inner.stride(),
            storage_offset=inner.storage_offset(),
            dtype=inner.dtype,
            device=FAKE,
        )

    def __init__(self, inner: torch.Tensor) -> None:
        self.inner = inner

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise DeviceMismatch(f"{func} on a device tensor outside the fake device")


def _wrap(out):
    return tree_map(lambda t: OnDevice(t) if type(t) is torch.Tensor else t, out)


class FakeAccelerator(TorchDispatchMode):
    """Runs device ops on the wrapped CPU tensors; refuses host tensors mixed into them."""

    def __init__(self) -> None:
        super().__init__()
        self.device_ops = 0
        self.waits: list[str] = []  # ops that make the host wait for a device value

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat, _ = tree_flatten((args, kwargs))
        on_device = any(isinstance(t, OnDevice) for t in flat)
        # the device an op names (a factory's device=, the target of .to()), if any
        named = [torch.device(d) for d in flat if isinstance(d, torch.device)]
        to_fake = FAKE in named
        if on_device:
            self.device_ops += 1
            if func in WAITING_OPS or (named and not to_fake):  # a value read, or a copy home
                self.waits.append(str(func))
            for t in flat:
                if type(t) is torch.Tensor and t.dim() > 0:
                    raise DeviceMismatch(
                        f"{func}: a host tensor {tuple(t.shape)} meets device tensors"
                    )

        def host(x):
            if isinstance(x, OnDevice):
                return x.inner
            return torch.device("cpu") if isinstance(x, torch.device) and x == FAKE else x

        args, kwargs = tree_map(host, (args, kwargs))
        out = func(*args, **kwargs)
        if func is torch.ops.aten._local_scalar_dense.default:
            return out  # .item(), int(), float(): a value for the host
        if to_fake or (on_device and not named):
            return _wrap(out)
        return out


class FakeFactories(TorchFunctionMode):
    """What dispatch cannot see: ``torch.tensor(data, device=...)`` builds its data outside
    dispatch (wrapped here), and the generator object a sampling call is given."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if (
            func in (torch.tensor, torch.as_tensor)
            and device is not None
            and torch.device(device) == FAKE
        ):
            return OnDevice(func(*args, **{**kwargs, "device": "cpu"}))
        gen = kwargs.get("generator")
        flat, _ = tree_flatten((args, kwargs))
        if (
            gen is not None
            and any(isinstance(t, OnDevice) for t in flat)
            and getattr(gen, "for_device", None) != FAKE
        ):
            raise DeviceMismatch(f"{func}: a generator of another device samples device tensors")
        return func(*args, **kwargs)


class RecordingGenerator(torch.Generator):
    """A CPU generator that remembers the device it was asked for."""

    def __new__(cls, device: torch.device | str = "cpu"):
        g = super().__new__(cls)
        g.for_device = torch.device(device)
        return g

    def __init__(self, device: torch.device | str = "cpu") -> None:
        pass


@pytest.fixture
def fake_accelerator(monkeypatch):
    """Enter the fake accelerator; torch.Generator records the device each generator is for."""
    monkeypatch.setattr(torch, "Generator", RecordingGenerator)
    mode = FakeAccelerator()
    # inference mode throughout: views of the (wrapped) KV cache made in a step need it
    with torch.inference_mode(), FakeFactories(), mode:
        yield mode


def test_the_fake_accelerator_catches_a_host_tensor(fake_accelerator):
    x = torch.zeros(3, device="meta")
    assert isinstance(x, OnDevice) and (x + 1).cpu().tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(DeviceMismatch):
        x + torch.ones(3)
    with pytest.raises(DeviceMismatch):
        x[torch.tensor([0, 1])]
    with pytest.raises(DeviceMismatch, match="generator"):
        torch.multinomial(x.softmax(-1), 1, generator=torch.Generator())


def _workload(engine: LLMEngine) -> dict[str, list[list[int]]]:
    """Prefill (chunked), decode, greedy and sampled rows, n samples (forks and copy-on-write),
    beam search, top-N logprobs, and swapping under a small pool."""
    long_prompt = list(range(100, 190))
    requests = {
        "greedy": engine.add_request(long_prompt, SamplingParams(temperature=0, max_tokens=12)),
        "sampled": engine.add_request(
            [5, 6, 7, 8, 9],
            SamplingParams(temperature=0.8, top_k=40, top_p=0.9, seed=1, max_tokens=10, logprobs=3),
        ),
        "nucleus": engine.add_request(
            [11, 12, 13], SamplingParams(top_p=0.5, seed=2, max_tokens=8)
        ),
        "n": engine.add_request(list(range(30, 51)), SamplingParams(n=3, seed=3, max_tokens=10)),
        "beam": engine.add_request(
            list(range(60, 80)), SamplingParams(beam_width=3, max_tokens=8, logprobs=2)
        ),
    }
    done = {}
    outputs = OutputAccumulator()
    for _ in range(300):
        if not engine.has_unfinished():
            break
        for update in engine.step():
            out = outputs.add(update)
            if out.finished:
                done[out.request_id] = out
    assert not engine.has_unfinished()
    assert all(o.error is None for o in done.values())
    for name, count in (("sampled", 3), ("beam", 2)):
        for c in done[requests[name]].outputs:
            assert [len(top) for top in c.top_logprobs] == [count] * len(c.token_ids)
    return {name: [c.token_ids for c in done[rid].outputs] for name, rid in requests.items()}


def _config(device: str) -> EngineConfig:
    return EngineConfig(
        device=device,
        kv_cache_bytes=12 * BLOCK_BYTES,
        preemption_mode="swap",
        max_num_batched_tokens=48,
    )


@pytest.fixture
def cpu_outputs(tiny_llama_dir):
    engine = LLMEngine.from_pretrained(
        str(tiny_llama_dir), _config("cpu"), progress=lambda _m: None
    )
    return _workload(engine)


@pytest.mark.slow  # a second or more by what it does (make test-fast's budget)
def test_every_step_stays_on_the_engine_device(tiny_llama_dir, cpu_outputs, fake_accelerator):
    engine = LLMEngine.from_pretrained(
        str(tiny_llama_dir), _config("meta"), progress=lambda _m: None
    )
    assert isinstance(engine.kv.k[0], OnDevice)
    outputs = _workload(engine)
    assert engine.stats().preemptions_swap > 0, "the workload must swap"
    assert fake_accelerator.device_ops > 1000
    # the same requests on the CPU (native kernels where built) give the same greedy tokens
    assert outputs["greedy"] == cpu_outputs["greedy"]
    assert [len(o) for o in outputs["n"]] == [10, 10, 10] and len(outputs["beam"]) == 3


def test_dense_weights_stream_straight_onto_the_device(tiny_llama_dir, fake_accelerator):
    """The streamed loader (engine/load/stream.py) puts each tensor on the device as it is read: the
    model's weights are device tensors, and a bf16 model's steps stay there too."""
    config = EngineConfig(device="meta", weight_dtype="bf16", kv_cache_bytes=12 * BLOCK_BYTES)
    engine = LLMEngine.from_pretrained(str(tiny_llama_dir), config, progress=lambda _m: None)
    assert engine.plan.device == "meta" and engine.stats().device == "meta"
    ids = torch.tensor([40, 41], device="meta")
    assert all(
        isinstance(t, OnDevice)
        for t in (engine.model.embed(ids), engine.model.norm, engine.model.layers[0].input_norm)
    )
    before = fake_accelerator.device_ops
    (out,) = engine.generate([list(range(40, 70))], SamplingParams(temperature=0, max_tokens=6))
    assert len(out.outputs[0].token_ids) == 6 and fake_accelerator.device_ops > before


def test_sampling_waits_for_the_device_once_per_step(fake_accelerator):
    """Greedy, temperature, top-k, top-p and logprob rows of one step sample on the device and
    come back in one copy, not one wait per row."""
    from chatpage.engine.sample.sampler import make_generator, sample

    logits = torch.randn(6, 300, device="meta")
    params = [
        SamplingParams(temperature=0),
        SamplingParams(temperature=0.8, seed=1),
        SamplingParams(top_k=20, seed=2),
        SamplingParams(top_p=0.7, seed=3),
        SamplingParams(top_k=5, top_p=0.9, seed=4),
        SamplingParams(temperature=0),
    ]
    generators = [make_generator(p.seed, 0, "meta") for p in params]
    fake_accelerator.waits.clear()
    tokens, logprobs, _, failed = sample(logits, params, generators)
    assert not failed
    assert fake_accelerator.waits == ["aten.to.dtype_layout"]  # the one copy home
    host = logits.cpu()
    assert tokens[0] == int(host[0].argmax()) and tokens[5] == int(host[5].argmax())
    assert all(0 <= t < 300 for t in tokens) and all(lp <= 0 for lp in logprobs)
