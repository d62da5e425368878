#!/usr/bin/env bash
# Prints the `pip install` arguments for torch (the Makefile's setup uses them).
# Where `nvidia-smi` works (a driver and a GPU), torch comes from PyPI itself, whose Linux wheel is
# the CUDA build, and a CPU-only torch already in the venv ($1, its python) is replaced. Elsewhere
# it is a plain requirement, which on a CPU machine takes the CPU wheel pip finds (here a local one).
set -euo pipefail

version="2.13.0"
python="${1:-}"
if "${NVIDIA_SMI:-nvidia-smi}" -L >/dev/null 2>&1; then
  args="--index-url https://pypi.org/simple"
  if [[ -n "$python" && -x "$python" ]] &&
      "$python" -c "import sys, torch; sys.exit(0 if torch.version.cuda is None else 1)" 2>/dev/null; then
    args="$args --force-reinstall"
  fi
  echo "$args torch==$version"
else
  echo "torch==$version"
fi
