#!/usr/bin/env bash
# The GPU path, proven in one go on a CUDA machine (<= 8 min on one H100/H200), offline, from a
# clone: builds the CUDA kernels, runs tests/gpu, then `bench kernel`, `bench kv` (decode over an
# int8 KV cache against bf16, 2k-token contexts) and `bench gpu` (decode tok/s
# at batch 1/32/128 against transformers' generate, CUDA graphs on and off, greedy equivalence
# with the CPU path on the tiny models and the default model), and writes ONE JSON (argument 1,
# default gpu_check.json; also printed). Each stage has a time limit and reports its own failure;
# the exit status is 0 only when every stage passed.
#   PYTHON   the interpreter (default .venv/bin/python, else python3)
#   MODEL    an HF model directory for the decode benchmark (default: the default model when it is
#            installed, else a random model of its shape: speed depends on the shape alone)
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$(realpath -m "${1:-gpu_check.json}")"
py="${PYTHON:-$root/.venv/bin/python}"
[[ -x "$py" ]] || py="$(command -v python3)"
cd "$root"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
if [[ -z "${TORCH_CUDA_ARCH_LIST:-}" ]]; then  # build for this GPU only (minutes, not tens)
  TORCH_CUDA_ARCH_LIST="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1)"
  export TORCH_CUDA_ARCH_LIST
fi
start=$SECONDS
stage() {  # stage NAME LIMIT_S COMMAND...: its output in $work/NAME.log, its status in NAME.rc
  local name=$1 limit=$2
  shift 2
  echo "gpu_check: $name ..." >&2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$work/$name.out" 2>"$work/$name.log"
  echo $? >"$work/$name.rc"
  echo $((SECONDS - t0)) >"$work/$name.s"
  echo "gpu_check: $name rc=$(cat "$work/$name.rc") in $(cat "$work/$name.s") s" >&2
}

stage build 300 "$py" -m chatpage.engine.model.ops --build
stage tests 200 "$py" -m pytest -q -p no:cacheprovider tests/gpu --junitxml="$work/junit.xml"
stage kernel 90 "$py" -c "import sys; from chatpage.bench import kernel; sys.exit(kernel.main(sys.argv[1:]))" \
  --device cuda --json --repeats 20
stage kv 150 "$py" -c "import sys; from chatpage.bench import kv; sys.exit(kv.main(sys.argv[1:]))" \
  --device cuda --json --scale 0.5
stage models 120 "$py" scripts/gpu_models.py "$work/models" "${MODEL:-}"
models=()
while read -r dir; do models+=(--equivalence "$dir"); done <"$work/models.out"
decode_model="$(sed -n 's/^decode //p' "$work/models.log")"
stage e2e 240 "$py" -c "import sys; from chatpage.bench import gpu; sys.exit(gpu.main(sys.argv[1:]))" \
  --json --model "$decode_model" "${models[@]}"

"$py" - "$work" "$out" "$((SECONDS - start))" <<'PY'
import json, sys, xml.etree.ElementTree as ET
from pathlib import Path

work, out, seconds = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
def stage(name):
    rc = int((work / f"{name}.rc").read_text())
    text = (work / f"{name}.out").read_text().strip()
    log = (work / f"{name}.log").read_text().strip().splitlines()
    entry = {"rc": rc, "seconds": int((work / f"{name}.s").read_text())}
    if rc != 0:
        entry["error"] = (log or ["(no output)"])[-1][:400]
    return entry, text
report = {"seconds": seconds}
report["build"], text = stage("build")
report["build"]["status"] = text
# the CUDA kernels themselves: a CPU-only build or the torch reference is a failed stage here
report["build"]["cuda_kernels"] = report["build"]["rc"] == 0 and "native (" in text \
    and "cpu only" not in text
tests, _ = stage("tests")
junit = work / "junit.xml"
if junit.is_file():
    suite = ET.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    tests.update(passed=n["tests"] - n["failures"] - n["errors"] - n["skipped"],
                 failed=n["failures"] + n["errors"], skipped=n["skipped"],
                 failing=[c.get("classname", "") + "::" + c.get("name", "")
                          for c in suite.iter("testcase")
                          if c.find("failure") is not None or c.find("error") is not None])
report["tests"] = tests
for name in ("kernel", "kv", "e2e"):
    entry, text = stage(name)
    try:
        entry["result"] = json.loads(text.splitlines()[-1])
    except (ValueError, IndexError):
        pass
    report[name] = entry
report["passed"] = report["build"]["cuda_kernels"] and tests.get("failed", 1) == 0 \
    and tests.get("passed", 0) > 0 and all(report[k]["rc"] == 0 for k in ("tests", "kernel", "kv", "e2e"))
out.write_text(json.dumps(report, indent=1) + "\n")
print(json.dumps(report))
sys.exit(0 if report["passed"] else 1)
PY
