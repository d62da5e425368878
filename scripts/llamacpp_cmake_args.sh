#!/bin/sh
# CMAKE_ARGS for building llama-cpp-python (the benchmarks' peer): native code, except on a CPU
# with AMX, where ggml's AMX matmul (batches of more than one token) segfaults on the virtualized
# Sapphire Rapids machines this project runs on (ggml-org/llama.cpp#20824): there the same
# AVX-512 paths are named one by one and the AMX ones left out.
if grep -q ' amx_int8' /proc/cpuinfo 2>/dev/null; then
  echo "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON" \
    "-DGGML_AVX_VNNI=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON" \
    "-DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
else
  echo "-DGGML_NATIVE=ON"
fi
