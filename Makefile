# Two commands matter: `make demo` and `make test`. Both build the venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export CDK_DISABLE_CLI_TELEMETRY := true

.PHONY: demo test bench clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

$(VENV)/.bench-installed: $(VENV)/.installed
	$(PY) -m pip install -q -e ".[dev,bench]"
	touch $@

demo: $(VENV)/.installed
	$(PY) -m agentq demo

test: $(VENV)/.installed
	$(PY) -m pytest -q -n 2 $(PYTEST_ARGS)

bench: $(VENV)/.bench-installed
	$(PY) bench/checkpoint_cost.py

clean:
	rm -rf $(VENV) cdk.out .pytest_cache
