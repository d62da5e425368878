"""EngineConfig: the knobs of the paged engine."""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from chatpage.vocab import (
    BLOCK_SIZES,
    DEFAULT_BLOCK_SIZE,
    DEFAULT_GPU_MEMORY_UTILIZATION,
    KV_CACHE_DTYPES,
    WEIGHT_FORMATS,
    check_device_name,
)

if TYPE_CHECKING:  # torch loads on the engine thread, not when the app imports this
    import torch

    from chatpage.config.settings import Settings

DTYPES = ("float32", "bfloat16", "float16", "auto")
"""The engine dtypes (activations, KV cache), by their torch names; "auto" is float32 on the CPU
and, on a GPU, an fp32 residual stream with the KV cache and matmuls in bf16 (engine/device.py)."""


def check_format(weights: str) -> str:
    """``weights`` if it names a format; ValueError naming the choices otherwise."""
    if weights not in WEIGHT_FORMATS:
        raise ValueError(
            f"unknown weight format {weights!r}: use one of {', '.join(WEIGHT_FORMATS)}"
        )
    return weights


class PreemptionMode(enum.StrEnum):
    """How a group is preempted when blocks run out (a str: "auto" etc. still work)."""

    AUTO = "auto"
    RECOMPUTE = "recompute"
    SWAP = "swap"


MiB = 1 << 20


@dataclass
class EngineConfig:
    """Configuration of an :class:`LLMEngine`.

    ``kv_cache_bytes`` is the budget of the device block pool (turned into a number of blocks once
    the model's shape is known); ``swap_space_bytes`` that of the CPU swap pool.
    ``preemption_mode`` "auto" recomputes single-sequence groups and swaps groups of several;
    groups of several swap in every mode while there is swap space.
    ``weight_dtype`` is the storage of the matmul weights ("fp32", "bf16", "int8", "int4"; see
    ``engine/model/weights.py``); fp32 here, the exact reference (the app's default is in settings).
    ``dtype`` names the torch dtype of activations and the KV cache (:attr:`torch_dtype`);
    ``kv_cache_dtype`` ("bf16", "int8") overrides the KV cache's.
    ``num_threads`` is torch's thread count on the thread that steps the engine (None: every core).
    ``device`` is "cpu" here (the exact reference; the app's default, "auto", is in settings),
    "auto", "cuda" or "cuda:N" (``engine/device.py`` resolves it when the engine starts). On a GPU
    the weights and activations are bf16 (fp16 on a GPU without bf16) and the KV pool is sized
    from the card's free memory: ``gpu_memory_utilization`` of it, less the weights and the
    activation peak of a forward of ``max_num_batched_tokens`` (``kv_cache_bytes`` is the CPU
    pool's budget only).
    ``kv_disk_bytes`` bounds the disk tier under the prefix cache (``engine/core/kv_tiers.py``:
    full blocks kept as files across processes, in ``kv_disk_dir``, None: the cache dir's kv/);
    0, the engine's default, keeps no tier (the app's default is in settings).
    ``kv_disk_prefetch``: a request's disk hits are read ahead, from when it is added, while
    earlier steps run, the request waiting for them while others run (False: read in the step
    that admits it). None: on where the pool is on a GPU, off on the CPU, where the reads take
    the cores the steps use (``chatpage bench resume`` (d): the turn's TTFT 1.33x longer).
    """

    block_size: int = DEFAULT_BLOCK_SIZE
    kv_cache_bytes: int = 512 * MiB
    swap_space_bytes: int = 512 * MiB
    enable_prefix_caching: bool = True
    preemption_mode: PreemptionMode = PreemptionMode.AUTO
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 1024
    max_model_len: int | None = None  # None: the model's own context length
    device: str = "cpu"
    dtype: str = "float32"
    weight_dtype: str = "fp32"
    kv_cache_dtype: str = "auto"  # vocab.KV_CACHE_DTYPES: "auto" is the plan's (engine/device.py)
    num_threads: int | None = None
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    cuda_graphs: bool = True  # replay decode steps through CUDA graphs on a GPU (False: eager)
    gpu_blocks: int | None = None  # a GPU pool of this many blocks instead of sizing it from memory
    # release a sliding-window layer's blocks once they leave the window (False: keep them all,
    # as full attention does; the output is the same, a check of the release)
    free_outside_window: bool = True
    kv_disk_bytes: int = 0
    kv_disk_dir: str | None = None
    kv_disk_prefetch: bool | None = None
    # draftless speculative decoding (engine/core/speculate.py): the most tokens drafted for one
    # sequence a step (0: off); each request may still turn it off (SamplingParams.speculate)
    num_speculative_tokens: int = 15

    @classmethod
    def for_settings(cls, settings: Settings, threads: int | None = None) -> EngineConfig:
        """The engine that config.yaml (and the command line's overrides) ask for."""
        return cls(
            kv_cache_bytes=settings.kv_cache,
            block_size=settings.block_size,
            weight_dtype=settings.weights,
            kv_cache_dtype=settings.kv_cache_dtype,
            num_threads=threads,
            device=settings.device,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            dtype="auto",
            kv_disk_bytes=settings.kv_disk,
            num_speculative_tokens=0 if settings.speculate == "off" else cls.num_speculative_tokens,
        )

    @property
    def threads(self) -> int:
        """The thread count to run the engine with: ``num_threads``, or every core."""
        return self.num_threads or os.cpu_count() or 1

    @property
    def torch_dtype(self) -> torch.dtype:
        """``dtype`` as a torch dtype (imports torch: call it on the engine's side); "auto" is
        float32, its meaning on the CPU (the engine's plan, ``engine/device.py``, has the rest)."""
        import torch

        dtype: torch.dtype = getattr(torch, "float32" if self.dtype == "auto" else self.dtype)
        return dtype

    def __post_init__(self) -> None:
        if self.block_size not in BLOCK_SIZES:
            sizes = ", ".join(map(str, BLOCK_SIZES[:-1])) + f" or {BLOCK_SIZES[-1]}"
            raise ValueError(f"EngineConfig.block_size must be {sizes}, got {self.block_size}")
        if self.kv_cache_bytes <= 0:
            raise ValueError(f"EngineConfig.kv_cache_bytes must be > 0, got {self.kv_cache_bytes}")
        if self.swap_space_bytes < 0:
            raise ValueError(
                f"EngineConfig.swap_space_bytes must be >= 0, got {self.swap_space_bytes}"
            )
        if self.preemption_mode not in tuple(PreemptionMode):
            raise ValueError(
                "EngineConfig.preemption_mode must be 'auto', 'recompute' or 'swap', "
                f"got {self.preemption_mode!r}"
            )
        if self.max_num_seqs < 1:
            raise ValueError(f"EngineConfig.max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < self.block_size:
            raise ValueError(
                "EngineConfig.max_num_batched_tokens must be >= block_size, "
                f"got {self.max_num_batched_tokens}"
            )
        if self.dtype not in DTYPES:
            raise ValueError(
                f"EngineConfig.dtype must be 'float32', 'bfloat16', 'float16' or "
                f"'auto', got {self.dtype!r}"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"EngineConfig.kv_cache_dtype must be {' or '.join(map(repr, KV_CACHE_DTYPES))}, "
                f"got {self.kv_cache_dtype!r}"
            )
        try:
            check_format(self.weight_dtype)
        except ValueError as e:
            raise ValueError(f"EngineConfig.weight_dtype: {e}") from None
        try:
            self.device = check_device_name(self.device)
        except ValueError as e:
            raise ValueError(f"EngineConfig.device: {e}") from None
        if self.gpu_blocks is not None and self.gpu_blocks < 1:
            raise ValueError(f"EngineConfig.gpu_blocks must be >= 1, got {self.gpu_blocks}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(
                "EngineConfig.gpu_memory_utilization must be in (0, 1], "
                f"got {self.gpu_memory_utilization}"
            )
        if self.kv_disk_bytes < 0:
            raise ValueError(f"EngineConfig.kv_disk_bytes must be >= 0, got {self.kv_disk_bytes}")
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"EngineConfig.num_threads must be >= 1, got {self.num_threads}")
