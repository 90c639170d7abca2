# specrt developer targets. `make help` lists them.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PROMPT ?= Write a Python function that checks whether a string is a palindrome, ignoring case and punctuation.

.PHONY: help venv install run test test-rs test-py test-load lint format bench-core wheel wheel-smoke env

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

venv: $(PY) ## create the virtual environment .venv

# Written by every successful install; `make run` reinstalls only when a file the install builds from is newer (so a
# later run needs no network: pip install -e would fetch maturin and rebuild each time).
INSTALL_STAMP := $(VENV)/.specrt-installed
INSTALL_INPUTS := Cargo.toml Cargo.lock pyproject.toml $(wildcard rust-toolchain.toml) \
	$(shell find rust -type f -not -path '*/target/*' 2>/dev/null)

define install-specrt
	@echo "specrt: installing into $(VENV): downloads, then the Rust extension's build (the first time one to a few minutes on 2 cores); progress below, the whole log in target/install.log"
	@mkdir -p target
	@set -o pipefail; $(PY) -m pip install -v -e '.[cpu,test]' 2>&1 | tee target/install.log \
		| { grep --line-buffered -E '^ *(Collecting|Downloading|Compiling|Finished|Built wheel for) |^Successfully installed' || true; } \
		|| { echo "specrt: pip install failed; the end of target/install.log:" >&2; tail -n 40 target/install.log >&2; exit 1; }
	@touch $(INSTALL_STAMP)
endef

install: $(PY) ## build the Rust extension and install specrt (editable) with test extras into .venv
	$(install-specrt)

$(INSTALL_STAMP): $(INSTALL_INPUTS) | $(PY)
	$(install-specrt)

run: $(INSTALL_STAMP) ## main job: pull the Qwen2.5-Coder 1.5B target (fp32) + 0.5B draft (int4) (cached) and generate with speculation (installs first only if the Rust sources, Cargo.toml/.lock or pyproject.toml changed)
	@echo "specrt: make run: Qwen2.5-Coder-1.5B-Instruct fp32 target with the 0.5B int4 draft, the fastest exact pair on a CPU (the fp32 target verifies every token, so the output is the target's own)"
	$(VENV)/bin/specrt generate --target qwen2.5-coder-1.5b-instruct --draft qwen2.5-coder-0.5b-instruct --draft-dtype int4 \
		--chat --prompt "$(PROMPT)" --max-new-tokens 128 --temperature 0 --num-speculative-tokens 4 --stats

test-rs: install ## Rust tests (all crates; the ONNX Runtime tests use the wheel's library and a tiny model, converted for GQA, batched attention and the graph form)
	$(PY) -c "import pathlib, shutil; from specrt.convert.tiny import write_tiny_gguf; from specrt.convert import convert; \
	p = pathlib.Path('target/test-model'); shutil.rmtree(p, ignore_errors=True); p.mkdir(parents=True); \
	g = write_tiny_gguf(p / 't.gguf', arch='qwen2', seed=1); convert(g, p / 'model', progress=False, prefill_graph=True); \
	convert(g, p / 'batched', progress=False, attention='batched', prefill_graph=True); convert(g, p / 'graph', progress=False, attention='gqa-graph'); \
	convert(g, p / 'graph-L1', progress=False, attention='gqa-graph', num_layers=1)"
	SPECRT_ORT_LIBRARY=$$($(PY) -c 'from specrt._ort import find_ort_library; print(find_ort_library())') \
	SPECRT_TEST_MODEL=$(CURDIR)/target/test-model/model SPECRT_TEST_BATCHED_MODEL=$(CURDIR)/target/test-model/batched \
	SPECRT_TEST_GRAPH_MODEL=$(CURDIR)/target/test-model/graph SPECRT_TEST_GRAPH_DRAFT=$(CURDIR)/target/test-model/graph-L1 cargo test --workspace

test-py: install ## Python tests (pytest; exit code 5 = no tests ran counts as failure)
	$(PY) -m pytest -q tests; rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest ran no tests" >&2; exit 1; fi; exit $$rc

test: test-rs test-py ## all tests (Rust then Python)

test-load: $(PY) ## the timing tests (pytest -m timing) 3 times in a row with every core kept busy (tests/cpu_hog.py); after make install
	$(PY) tests/cpu_hog.py -- bash -c 'for run in 1 2 3; do echo "test-load: run $$run of 3 under load"; \
		$(PY) -m pytest -q -m timing tests || { echo "test-load: run $$run failed" >&2; exit 1; }; done'

lint: $(PY) ## format checks and linters
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings
	$(VENV)/bin/ruff check python tests benches
	$(VENV)/bin/ruff format --check python tests benches

format: $(PY) ## apply formatting
	cargo fmt --all
	$(VENV)/bin/ruff format python tests benches

wheel: $(PY) ## build the abi3 manylinux_2_28 wheel into dist/ (maturin with the zig linker from PyPI; no manylinux image needed)
	$(PY) -m pip install -q 'maturin>=1.9.4,<2' ziglang auditwheel
	rm -rf dist
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(VENV)/bin/maturin build --release --zig --compatibility manylinux_2_28 --out dist

wheel-smoke: wheel ## auditwheel tag check; install the wheel into a clean venv with no Rust on PATH; generate with SmolLM2
	bash .ci/wheel_smoke.sh dist/specrt-*.whl

env: install ## print the environment report (ONNX Runtime library, providers, CUDA, GPUs) for bug reports
	$(VENV)/bin/specrt env

bench-core: ## criterion benches of the verification kernel
	cargo bench -p specrt-core
