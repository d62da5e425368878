"""Which device the engine runs on: ``auto``, ``cpu``, ``cuda`` or ``cuda:N`` resolved against
what torch reports, and the GPU memory arithmetic that sizes the KV pool there.

Both are pure functions over plain data (:class:`CudaReport`, :func:`kv_pool_bytes`), so the CPU
test suite covers every case a GPU machine (or a machine without one) can present; only
:func:`probe_cuda` and :func:`measure_memory` ask torch.
"""

from __future__ import annotations

import ctypes.util
import shutil
from dataclasses import dataclass, replace

from chatpage.vocab import check_device_name


class DeviceError(ValueError):
    """The device asked for does not exist here; the message is one line saying what is missing
    and what to do."""


@dataclass(frozen=True)
class CudaReport:
    """What torch (and the system) say about CUDA on this machine."""

    torch_version: str  # torch.__version__
    cuda_build: str | None  # torch.version.cuda: None for a CPU-only build of torch
    driver: bool  # an NVIDIA driver library (libcuda) can be found
    gpus: tuple[str, ...]  # the names of the GPUs torch sees, cuda:0 first
    bf16: tuple[bool, ...] = ()  # per GPU: whether it computes in bf16 (compute capability 8+)
    int8_kernel: bool = False  # torch has a CUDA kernel for _weight_int8pack_mm


@dataclass(frozen=True)
class Placement:
    """A resolved device: its torch name, the dtype weights and activations take there, and the
    one line that says what was chosen and why (shown at start and in `chatpage config`)."""

    device: str  # "cpu", "cuda:0", ... (or "meta" for the tests' fake accelerator)
    why: str

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")


def probe_cuda() -> CudaReport:
    """Ask torch (imported here) what CUDA it has and sees."""
    import torch

    names: list[str] = []
    bf16: list[bool] = []
    if torch.version.cuda and torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            names.append(torch.cuda.get_device_name(i))
            bf16.append(torch.cuda.get_device_capability(i)[0] >= 8)
    # the driver is looked for only to explain why a CUDA torch sees no GPU
    has_driver = bool(names) or (
        bool(torch.version.cuda)
        and (ctypes.util.find_library("cuda") is not None or shutil.which("nvidia-smi") is not None)
    )
    int8 = bool(names) and has_cuda_kernel("aten::_weight_int8pack_mm")
    return CudaReport(
        torch.__version__, torch.version.cuda, has_driver, tuple(names), tuple(bf16), int8
    )


def _missing_cuda(asked: str, report: CudaReport) -> str:
    """The one line for ``--device cuda`` on a machine where torch has no usable GPU."""
    if not report.cuda_build:
        return (
            f"--device {asked}: this torch ({report.torch_version}) is a CPU-only build; "
            "install torch's CUDA build (`pip install torch` on Linux, or `make setup` on a "
            "machine where nvidia-smi works) or use --device cpu"
        )
    if not report.driver:
        return (
            f"--device {asked}: torch {report.torch_version} has CUDA {report.cuda_build} but "
            "no NVIDIA driver was found; install the driver (nvidia-smi must work) or use "
            "--device cpu"
        )
    return (
        f"--device {asked}: torch {report.torch_version} (CUDA {report.cuda_build}) sees no "
        "GPU; check `nvidia-smi` and CUDA_VISIBLE_DEVICES, or use --device cpu"
    )


def resolve_device(asked: str, report: CudaReport) -> Placement:
    """``asked`` (auto | cpu | cuda | cuda:N, or a torch device name such as "meta") as a
    :class:`Placement`; :class:`DeviceError` when it names a GPU that is not there."""
    try:
        name = check_device_name(asked)
    except ValueError as e:
        raise DeviceError(str(e)) from None
    gpus = report.gpus
    if name == "auto":
        if gpus:
            return Placement("cuda:0", f"cuda:0 ({gpus[0]}; auto: the first CUDA GPU)")
        reason = (
            "a CPU-only torch"
            if not report.cuda_build
            else "no NVIDIA driver"
            if not report.driver
            else "torch sees no GPU"
        )
        return Placement("cpu", f"cpu (auto: {reason})")
    if not name.startswith("cuda"):
        return Placement(name, f"{name} (asked for)")
    if not gpus:
        raise DeviceError(_missing_cuda(asked, report))
    index = int(name.partition(":")[2] or 0)
    if index >= len(gpus):
        seen = ", ".join(f"cuda:{i}" for i in range(len(gpus)))
        raise DeviceError(
            f"--device {asked}: torch sees {len(gpus)} GPU(s) ({seen}); pick one of those"
        )
    return Placement(f"cuda:{index}", f"cuda:{index} ({gpus[index]})")


def gpu_has_bf16(placement: Placement, report: CudaReport) -> bool:
    """Whether the GPU of ``placement`` computes in bf16 (compute capability 8+); the dense
    weights, matmul inputs and KV cache take fp16 on one that does not."""
    index = int(placement.device.partition(":")[2] or 0)
    return report.bf16[index] if index < len(report.bf16) else True


def gpu_weights(
    weights: str, bf16: bool, int8_kernel: bool, dense: str = "bf16"
) -> tuple[str, str | None]:
    """The weight format a GPU runs for the asked ``weights``, and a one-line note when it is not
    the one asked for. Dense weights are ``dense`` there ("bf16": stored in the GPU's half
    dtype; "fp32": kept in the activations' dtype); int4 runs through torch's CUDA int4 matmul
    (``_weight_int4pack_mm``, compute capability 8+), int8 through ``_weight_int8pack_mm`` where
    this torch has a CUDA kernel for it; otherwise the format is CPU-only and bf16 is used."""
    if weights in ("fp32", "bf16"):
        return ("bf16" if weights == "bf16" else dense), None
    if weights == "int4" and bf16:
        return "int4", None
    if weights == "int8" and int8_kernel and bf16:
        return "int8", None
    why = (
        "torch's CUDA int4 matmul needs compute capability 8.0+"
        if weights == "int4"
        else "this torch has no CUDA kernel for the int8 matmul"
    )
    return "bf16", f"{weights} weights are CPU-only here ({why}); using bf16 on the GPU"


def has_cuda_kernel(op: str) -> bool:
    """Whether this torch registers a CUDA kernel for ``op`` (e.g. "aten::_weight_int8pack_mm")."""
    import torch

    return bool(torch._C._dispatch_has_kernel_for_dispatch_key(op, "CUDA"))


@dataclass(frozen=True)
class EnginePlan:
    """Where and in what the engine runs, decided once from the config and what torch reports.

    ``dtype`` is the activations' (the residual stream, norms, RoPE, queries); ``kv_dtype`` the KV
    cache's; ``mm_dtype`` the matmul inputs' and dense weights' (None: as the weight format
    says, ``engine/weights.matmul_dtype``); ``weights`` the format the weights are stored in;
    ``notes`` one-line messages for the user (a format that fell back)."""

    device: str
    why: str
    dtype: str
    kv_dtype: str
    mm_dtype: str | None
    weights: str
    notes: tuple[str, ...] = ()


def plan_engine(
    device: str, dtype: str, weights: str, report: CudaReport, kv_cache: str = "auto"
) -> EnginePlan:
    """The :class:`EnginePlan` for an engine config's ``device``, ``dtype`` ("auto" or a torch
    dtype name), ``weights`` and ``kv_cache`` (``vocab.KV_CACHE_DTYPES``: "bf16" and "int8" are
    the KV cache's dtype whatever ``dtype`` says, "auto" as below).

    On the CPU "auto" is float32 throughout, except the KV cache of a quantized or bf16 weight
    format, which is bf16: decode attention over long contexts is bound by reading the cache
    (half the bytes: 34 against 50 ms a step for 32 sequences of 320 tokens on one core of an
    AVX-512 Xeon, the 30 layers of the default model), and twice the tokens fit a KV budget;
    fp32 weights keep the exact fp32 reference throughout. On a GPU "auto" keeps the residual
    stream in fp32 (the fused CUDA ops read it so) and puts the KV cache, the matmul inputs and
    dense weights in bf16 (fp16 on a GPU without bf16); an explicit dtype is used throughout, as
    on the CPU, with fp32 weights kept dense in it (the exact comparison with the CPU path)."""
    placement = resolve_device(device, report)
    plan = _plan(placement, dtype, weights, report)
    if kv_cache == "int8":
        return replace(plan, kv_dtype="int8")
    if kv_cache == "bf16":  # (fp16 on a GPU without bf16, as its "auto")
        half = not placement.is_cuda or gpu_has_bf16(placement, report)
        return replace(plan, kv_dtype="bfloat16" if half else "float16")
    return plan


def _plan(placement: Placement, dtype: str, weights: str, report: CudaReport) -> EnginePlan:
    """`plan_engine` with the KV cache's dtype "auto"."""
    if not placement.is_cuda:
        if dtype != "auto":
            return EnginePlan(placement.device, placement.why, dtype, dtype, None, weights)
        kv = "float32" if weights == "fp32" else "bfloat16"
        return EnginePlan(placement.device, placement.why, "float32", kv, None, weights)
    bf16 = gpu_has_bf16(placement, report)
    half = "bfloat16" if bf16 else "float16"
    if dtype == "auto":
        fmt, note = gpu_weights(weights, bf16, report.int8_kernel)
        return EnginePlan(
            placement.device, placement.why, "float32", half, half, fmt, (note,) if note else ()
        )
    fmt, note = gpu_weights(weights, bf16, report.int8_kernel, dense="fp32")
    return EnginePlan(
        placement.device, placement.why, dtype, dtype, None, fmt, (note,) if note else ()
    )


# -- the KV pool on a GPU ------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuMemory:
    """Bytes of one GPU, read after the weights are loaded and a forward of the largest batch
    was run: the card's total, what is free, and the peak the activations of that forward added
    above the memory in use before it."""

    total: int
    free: int
    activation_peak: int


def kv_pool_bytes(memory: GpuMemory, utilization: float, block_bytes: int) -> int:
    """The KV pool's budget, vLLM's way: ``utilization`` of the card, less everything in use
    (this process's weights, other processes) and the activation peak; a whole number of blocks.
    :class:`DeviceError` when not one block fits."""
    if not 0 < utilization <= 1:
        raise DeviceError(f"gpu_memory_utilization must be in (0, 1], got {utilization}")
    in_use = memory.total - memory.free
    budget = int(memory.total * utilization) - in_use - memory.activation_peak
    blocks = max(budget, 0) // block_bytes
    if blocks < 1:
        mib = 1 << 20
        raise DeviceError(
            f"no KV block fits on the GPU: {utilization:.0%} of {memory.total // mib} MiB, less "
            f"{in_use // mib} MiB in use (weights, other processes) and a {memory.activation_peak // mib} "
            "MiB activation peak, leaves less than one block; raise --gpu-memory-utilization, "
            "lower --max-num-batched-tokens, or use a smaller model"
        )
    return blocks * block_bytes


def measure_memory(device: str, before_forward: int) -> GpuMemory:
    """The card's total and free memory now, and the peak allocated since the statistics were
    reset above ``before_forward`` bytes (call after the profiling forward; the blocks the
    forward left in torch's cache are given back first, so they do not count twice)."""
    import torch

    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    peak = torch.cuda.max_memory_allocated(device) - before_forward
    return GpuMemory(total=total, free=free, activation_peak=max(peak, 0))
