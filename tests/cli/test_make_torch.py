"""`make setup` picks torch's build by whether `nvidia-smi` works (scripts/torch_pip_args.sh):
checked with fake `nvidia-smi` programs on PATH and a dry run of the Makefile."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "torch_pip_args.sh"


def _fake_smi(bin_dir: Path, code: int, text: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho '{text}'\nexit {code}\n")
    smi.chmod(0o755)


def _args(path: str, *argv: str) -> str:
    env = {**os.environ, "PATH": path}
    env.pop("NVIDIA_SMI", None)
    return subprocess.run(
        [str(SCRIPT), *argv], capture_output=True, text=True, env=env, check=True
    ).stdout.strip()


@pytest.mark.slow  # a second or more by what it does (make test-fast's budget)
def test_a_working_nvidia_smi_installs_the_cuda_build_from_pypi(tmp_path):
    _fake_smi(tmp_path / "gpu", 0, "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)")
    path = f"{tmp_path / 'gpu'}:/usr/bin:/bin"
    assert _args(path) == "--index-url https://pypi.org/simple torch==2.13.0"
    # a CPU-only torch already in the venv is replaced (this machine's is one)
    assert (
        _args(path, sys.executable)
        == "--index-url https://pypi.org/simple --force-reinstall torch==2.13.0"
    )


def test_without_a_working_gpu_the_cpu_wheel_stays(tmp_path):
    assert _args("/usr/bin:/bin") == "torch==2.13.0"  # no nvidia-smi at all (this machine)
    _fake_smi(
        tmp_path / "broken",
        9,
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver",
    )
    assert _args(f"{tmp_path / 'broken'}:/usr/bin:/bin", sys.executable) == "torch==2.13.0"


def test_the_makefile_installs_torch_by_that_decision(tmp_path):
    dry = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "setup", f"VENV={tmp_path / 'venv'}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    torch_lines = [line for line in dry.splitlines() if "torch" in line]
    assert torch_lines == [
        f"{tmp_path / 'venv'}/bin/pip install -q "
        f"$(./scripts/torch_pip_args.sh {tmp_path / 'venv'}/bin/python)"
    ]
