#!/usr/bin/env bash
# Compile-checks every csrc/cuda/*.cu with nvcc for sm_80 and sm_90 (no torch, no GPU needed).
# Prints a skip line and succeeds when nvcc is not installed; fails on the first compile error.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
nvcc_bin="${NVCC:-$(command -v nvcc || true)}"
if [[ -z "$nvcc_bin" && -x /usr/local/cuda/bin/nvcc ]]; then
  nvcc_bin=/usr/local/cuda/bin/nvcc
fi
if [[ -z "$nvcc_bin" ]]; then
  echo "check_cuda: skipped (nvcc not found)"
  exit 0
fi

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
shopt -s nullglob
sources=("$root"/csrc/cuda/*.cu)
if (( ${#sources[@]} == 0 )); then
  echo "check_cuda: no .cu files under csrc/cuda"
  exit 1
fi

start=$SECONDS
for src in "${sources[@]}"; do
  name="$(basename "$src" .cu)"
  "$nvcc_bin" -c "$src" -o "$out/$name.o" -std=c++20 -O3 -I "$root/csrc" \
    -Xcompiler -Wall -Werror all-warnings \
    -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90
  echo "check_cuda: ok   csrc/cuda/$name.cu"
done
echo "check_cuda: ${#sources[@]} file(s) compiled for sm_80 and sm_90 in $((SECONDS - start)) s ($("$nvcc_bin" --version | tail -1))"
