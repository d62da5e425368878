"""Choosing the device (engine/device.py) for every machine torch can describe, the GPU memory
arithmetic of the KV pool, and the flags and settings that carry the choice: all on the CPU, with
what torch reports injected as a CudaReport."""

from __future__ import annotations

import io

import pytest

from chatpage.cli.main import main
from chatpage.config.settings import load_settings
from chatpage.engine.config import EngineConfig
from chatpage.engine.device import (
    CudaReport,
    DeviceError,
    GpuMemory,
    kv_pool_bytes,
    plan_engine,
    probe_cuda,
    resolve_device,
)
from chatpage.engine.model.weights import int4pack_inner_tiles

GiB, MiB = 1 << 30, 1 << 20
CPU_TORCH = CudaReport("2.13.0+cpu", None, False, ())
NO_DRIVER = CudaReport("2.13.0", "13.0", False, ())
NO_GPU = CudaReport("2.13.0", "13.0", True, ())
ONE_H100 = CudaReport("2.13.0", "13.0", True, ("NVIDIA H100",), (True,))
TWO_GPUS = CudaReport(
    "2.13.0", "13.0", True, ("NVIDIA H100", "Tesla T4"), (True, False), int8_kernel=True
)


@pytest.mark.parametrize(
    ("report", "device", "why"),
    [
        (ONE_H100, "cuda:0", "cuda:0 (NVIDIA H100; auto: the first CUDA GPU)"),
        (CPU_TORCH, "cpu", "cpu (auto: a CPU-only torch)"),
        (NO_DRIVER, "cpu", "cpu (auto: no NVIDIA driver)"),
        (NO_GPU, "cpu", "cpu (auto: torch sees no GPU)"),
    ],
)
def test_auto_takes_the_first_gpu_else_the_cpu_and_says_why(report, device, why):
    placement = resolve_device("auto", report)
    assert (placement.device, placement.why) == (device, why)


@pytest.mark.parametrize(
    ("report", "missing"),
    [
        (CPU_TORCH, "this torch (2.13.0+cpu) is a CPU-only build; install torch's CUDA build"),
        (NO_DRIVER, "has CUDA 13.0 but no NVIDIA driver was found; install the driver"),
        (NO_GPU, "sees no GPU; check `nvidia-smi` and CUDA_VISIBLE_DEVICES"),
    ],
)
def test_cuda_without_a_gpu_is_one_line_naming_what_is_missing(report, missing):
    for asked in ("cuda", "cuda:0"):
        with pytest.raises(DeviceError) as e:
            resolve_device(asked, report)
        text = str(e.value)
        assert "\n" not in text and text.startswith(f"--device {asked}: ")
        assert missing in text and text.endswith("use --device cpu")


def test_cuda_indexes_and_bad_names():
    assert resolve_device("CUDA", TWO_GPUS).device == "cuda:0"
    assert resolve_device("cuda:1", TWO_GPUS).why == "cuda:1 (Tesla T4)"
    assert resolve_device("cpu", TWO_GPUS).device == "cpu"
    with pytest.raises(DeviceError, match=r"sees 2 GPU\(s\) \(cuda:0, cuda:1\); pick one"):
        resolve_device("cuda:2", TWO_GPUS)
    with pytest.raises(DeviceError, match="unknown device 'gpu': use auto, cpu, cuda or cuda:N"):
        resolve_device("gpu", ONE_H100)


def test_this_machine_has_no_gpu():
    report = probe_cuda()
    assert report.gpus == () and resolve_device("auto", report).device == "cpu"


def test_the_plan_on_the_cpu_keeps_bf16_kv_for_quantized_weights():
    # fp32 activations; a quantized or bf16 format reads a bf16 KV cache (half the bytes)
    for weights in ("int4", "int8", "bf16"):
        plan = plan_engine("auto", "auto", weights, CPU_TORCH)
        assert (plan.device, plan.dtype, plan.kv_dtype, plan.mm_dtype, plan.weights) == (
            "cpu",
            "float32",
            "bfloat16",
            None,
            weights,
        )
    # fp32 weights are the exact reference: fp32 throughout
    plan = plan_engine("cpu", "auto", "fp32", CPU_TORCH)
    assert (plan.dtype, plan.kv_dtype) == ("float32", "float32")
    # an explicit dtype is used throughout
    assert plan_engine("cpu", "float32", "int4", CPU_TORCH).kv_dtype == "float32"
    assert plan_engine("cpu", "bfloat16", "fp32", ONE_H100).kv_dtype == "bfloat16"


def test_the_kv_cache_dtype_overrides_the_plans():
    """--kv-cache-dtype: int8 and bf16 name the KV cache whatever dtype and weights say; auto
    keeps the plan's (fp16 for bf16 on a GPU without bf16)."""
    for device, report in (("cpu", CPU_TORCH), ("cuda", ONE_H100)):
        for dtype in ("auto", "float32"):
            assert plan_engine(device, dtype, "fp32", report, "int8").kv_dtype == "int8"
            assert plan_engine(device, dtype, "int4", report, "bf16").kv_dtype == "bfloat16"
    assert plan_engine("cpu", "auto", "fp32", CPU_TORCH, "auto").kv_dtype == "float32"
    plan = plan_engine("cpu", "auto", "int4", CPU_TORCH, "int8")
    assert (plan.dtype, plan.weights) == ("float32", "int4")  # only the cache changes


def test_the_plan_on_a_gpu():
    # auto: an fp32 residual stream (the fused CUDA ops read it), bf16 KV cache and matmuls
    plan = plan_engine("auto", "auto", "fp32", ONE_H100)
    assert (plan.device, plan.dtype, plan.kv_dtype, plan.mm_dtype, plan.weights, plan.notes) == (
        "cuda:0",
        "float32",
        "bfloat16",
        "bfloat16",
        "bf16",
        (),
    )
    assert plan_engine("cuda", "auto", "int4", ONE_H100).weights == "int4"
    # int8 without torch's CUDA int8 kernel: CPU-only, bf16 instead, said in one line
    plan = plan_engine("cuda", "auto", "int8", ONE_H100)
    assert plan.weights == "bf16"
    assert plan.notes == (
        "int8 weights are CPU-only here (this torch has no CUDA kernel for the "
        "int8 matmul); using bf16 on the GPU",
    )
    assert plan_engine("cuda", "auto", "int8", TWO_GPUS).weights == "int8"
    # a GPU without bf16 (a T4): fp16, and int4 falls back to the dense format
    plan = plan_engine("cuda:1", "auto", "int4", TWO_GPUS)
    assert (plan.kv_dtype, plan.mm_dtype, plan.weights) == ("float16", "float16", "bf16")
    assert "int4 weights are CPU-only here" in plan.notes[0]
    # an explicit dtype runs throughout, fp32 weights stay dense in it (the exact comparison)
    plan = plan_engine("cuda", "float32", "fp32", ONE_H100)
    assert (plan.dtype, plan.kv_dtype, plan.mm_dtype, plan.weights) == (
        "float32",
        "float32",
        None,
        "fp32",
    )


def test_the_kv_pool_is_what_the_gpu_has_left():
    memory = GpuMemory(total=80 * GiB, free=60 * GiB, activation_peak=2 * GiB)
    # 90% of 80 GiB = 72, less 20 in use (weights, others) and 2 of activations = 50 GiB
    assert kv_pool_bytes(memory, 0.9, 1 * MiB) == 50 * GiB
    assert kv_pool_bytes(memory, 0.9, 3 * MiB) == (50 * GiB // (3 * MiB)) * 3 * MiB
    assert kv_pool_bytes(memory, 1.0, 1 * MiB) == 58 * GiB
    with pytest.raises(
        DeviceError, match="no KV block fits on the GPU: 25% of 81920 MiB, less 20480 MiB in use"
    ):
        kv_pool_bytes(memory, 0.25, 1 * MiB)
    with pytest.raises(DeviceError, match=r"gpu_memory_utilization must be in \(0, 1\]"):
        kv_pool_bytes(memory, 1.5, 1 * MiB)


def test_int4_tiles_of_torchs_cuda_layout():
    assert [int4pack_inner_tiles(k) for k in (4096, 576, 1536, 96)] == [8, 4, 8, 2]
    with pytest.raises(ValueError, match="divisible by 32"):
        int4pack_inner_tiles(40)


def test_settings_and_engine_config_carry_the_device(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("device: CUDA:1\ngpu_memory_utilization: 0.5\n")
    settings, warnings = load_settings(path)
    assert (settings.device, settings.gpu_memory_utilization, warnings) == ("cuda:1", 0.5, [])
    config = EngineConfig.for_settings(settings)
    assert (config.device, config.gpu_memory_utilization, config.dtype) == ("cuda:1", 0.5, "auto")
    path.write_text("device: gpu\ngpu_memory_utilization: 2\n")
    settings, warnings = load_settings(path, {"device": None})
    assert (settings.device, settings.gpu_memory_utilization) == ("auto", 0.9)
    assert (
        "config.yaml: device = 'gpu' is not valid; expected auto, cpu, cuda or cuda:N"
        in warnings[0]
    )
    assert "gpu_memory_utilization = 2 is not valid" in warnings[1]
    with pytest.raises(ValueError, match="EngineConfig.device: unknown device 'tpu'"):
        EngineConfig(device="tpu")


def test_the_cli_refuses_a_missing_gpu_in_one_line(capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # `ask` reads piped input as context
    for argv in (
        ["--device", "cuda"],
        ["serve", "--device", "cuda:0"],
        ["ask", "--device", "cuda", "hello"],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0, err
        assert err.startswith("chatpage: error: --device cuda") and "CPU-only build" in err
    with pytest.raises(SystemExit):
        main(["ask", "--device", "gpu", "hi"])
    assert "unknown device 'gpu'" in capsys.readouterr().err


def test_chatpage_config_shows_where_the_engine_would_run(capsys):
    assert main(["config"]) == 0
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("device")]
    assert row and row[0].split()[1:3] == ["default", "auto"]
    assert row[0].endswith("auto -> cpu (auto: a CPU-only torch)")
    assert main(["--device", "cuda", "config"]) == 0
    assert "cuda -> error: --device cuda: this torch" in capsys.readouterr().out
