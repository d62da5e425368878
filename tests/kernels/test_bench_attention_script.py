"""scripts/bench_attention.py (docs/kernels.md's int8 figures) runs and reports both caches."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_attention.py"


@pytest.mark.parametrize("kv", ["bf16", "int8"])
def test_it_times_the_kernel_over_scattered_blocks(kv):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "3", "40", kv, "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(
        rf"3 rows x 40 keys, {kv} KV, 1 thread\(s\): [0-9.]+ ms for 30 layers, [0-9.]+ GB/s of KV",
        line,
    ), line
