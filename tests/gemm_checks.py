"""The tiled GEMMs (csrc/cpu/gemm.cpp) against their torch references (chatpage/engine/model/gemv.py),
and the q8 GEMMs (csrc/cpu/gemm_q8.cpp) against theirs, shared by tests/kernels/test_gemm.py's in-process
tests (this machine's build) and its AVX2 build and its AVX-512 build without AMX, which run this
file as a script in a process of their own (a second kernel library cannot be loaded beside the
first): ``python tests/gemm_checks.py CACHE_DIR BUILD`` builds with ``ops.TEST_BUILDS[BUILD]``,
runs every case (``gemv_checks.check_op``; the q8 cases where the build has them) and prints how
many passed."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import torch
from gemv_checks import level_cases, run_cases_on_build

BF16, F32 = torch.bfloat16, torch.float32
# rows: below, at and past the 4-row (AVX2: 2-row) tile, with leftovers, and past gemm.cpp's
# kOneDnnRows (with AMX, bf16 activations: the matrix decoded once and torch's matmul); outputs: fewer than a
# block of 6, blocks plus leftovers; inputs: not a multiple of 8 or 16 (int8, bf16), one int4
# group, an odd number of groups, more than one 768-input chunk
ROWS = [2, 5, 13, 70, 400]
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
# The q8 GEMMs (csrc/cpu/gemm_q8.cpp: int8 and int4, the activations quantized to int8 blocks) on
# the builds that have them (gemm_q8(): AVX-512 VNNI, or AVX2's maddubs): rows below, at and past the 4-row tile;
# outputs below one vector of 16, past the 32 of a task, and two whole tasks (which a q8 pack
# takes: there the packed product must be the same bits); inputs not a multiple of 4 or 32
# (int8), one group, an odd count of groups, the default model's down projection
Q8_ROWS = [1, 4, 7, 70]
Q8_OUTPUTS = [7, 45, 64]
Q8_INPUTS = {"int8": [45, 576, 1600], "int4": [32, 96, 1536]}
Q8_CASES = [
    (fmt, m, n, k, dtype, bias)
    for fmt in ("int8", "int4")
    for m, n, k, dtype, bias in itertools.product(
        Q8_ROWS, Q8_OUTPUTS, Q8_INPUTS[fmt], (F32, BF16), (False, True)
    )
]
Q8_CASES += level_cases(Q8_ROWS, Q8_OUTPUTS, Q8_INPUTS["int4"])


if __name__ == "__main__":
    run_cases_on_build("gemm", CASES, Path(sys.argv[1]), sys.argv[2], q8=Q8_CASES)
