"""The tiled GEMMs (csrc/cpu/gemm.cpp) against their torch references (chatpage/engine/gemv.py),
shared by tests/test_gemm.py's in-process tests (this machine's build) and its AVX2 build, which
and its AVX-512 build without AMX run this file as a script in a process of their own (a second
kernel library cannot be loaded beside the first): ``python tests/gemm_checks.py CACHE_DIR
BUILD`` builds with ``ops.TEST_BUILDS[BUILD]``, runs every case (``gemv_checks.check_op``) and
prints how many passed."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import torch
from gemv_checks import level_cases, run_cases_on_build

BF16, F32 = torch.bfloat16, torch.float32
# rows: below, at and past the 4-row (AVX2: 2-row) tile, with leftovers; outputs: fewer than a
# block of 6, blocks plus leftovers; inputs: not a multiple of 8 or 16 (int8, bf16), one int4
# group, an odd number of groups, more than one 768-input chunk
ROWS = [2, 5, 13, 70]
OUTPUTS = [7, 21]
INPUTS = {"bf16": [45, 576, 1600], "int8": [45, 576, 1600], "int4": [32, 96, 1600]}
CASES = [
    (fmt, m, n, k, dtype, bias)
    for fmt in ("bf16", "int8", "int4")
    for m, n, k, dtype, bias in itertools.product(
        ROWS, OUTPUTS, INPUTS[fmt], (F32, BF16), (False, True)
    )
]
CASES += level_cases(ROWS, OUTPUTS, INPUTS["int4"])  # int4 with a table of levels of its own


if __name__ == "__main__":
    run_cases_on_build("gemm", CASES, Path(sys.argv[1]), sys.argv[2])
