# Two commands matter: `make demo` and `make test`. Both build the venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
TEST_WORKERS ?= 6
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export CDK_DISABLE_CLI_TELEMETRY := true

.PHONY: durations demo test lint layers bench chaos clean sandbox-tools chromium console-screenshots cdk upgrade-deps

# One venv, two installs. `make test` installs everything (.[dev]); `make demo` only the runtime
# and the embedded AWS (.[local]), unless the full install is already there and current (a
# superset). Each stamp is keyed on pyproject.toml and the pins, so either order works and an
# edit reinstalls. Every install takes its versions from requirements/constraints.txt (pip,
# and setuptools for the editable build, included): a fresh machine gets exactly what the suite
# was proven with. `make upgrade-deps` moves the pins.
CONSTRAINTS := requirements/constraints.txt
PIP_INSTALL = $(PY) -m pip install -q -c $(CONSTRAINTS) --build-constraint $(CONSTRAINTS)

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install -q -c $(CONSTRAINTS) --upgrade pip setuptools

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS) | $(PY)
	$(PIP_INSTALL) -e ".[dev]" pip setuptools
	touch $@

$(VENV)/.local-installed: pyproject.toml $(CONSTRAINTS) | $(PY)
	if [ -f $(VENV)/.installed ] && [ $(VENV)/.installed -nt pyproject.toml ] && [ $(VENV)/.installed -nt $(CONSTRAINTS) ]; then :; \
	else $(PIP_INSTALL) -e ".[local]"; fi
	touch $@

# What `npx cdk synth/deploy` runs (cdk.json: .venv/bin/python app.py): aws-cdk-lib, cdk-nag, cfn-lint.
# `make test` installs them too; after `make demo` alone, `make cdk` adds just these.
$(VENV)/.cdk-installed: pyproject.toml $(CONSTRAINTS) | $(PY)
	if [ -f $(VENV)/.installed ] && [ $(VENV)/.installed -nt pyproject.toml ] && [ $(VENV)/.installed -nt $(CONSTRAINTS) ]; then :; \
	else $(PIP_INSTALL) -e ".[local,cdk]"; fi
	touch $@

cdk: $(VENV)/.cdk-installed

$(VENV)/.bench-installed: $(VENV)/.installed
	$(PIP_INSTALL) -e ".[dev,bench]"
	touch $@

# Move the pins: every extra resolved afresh inside pyproject's ranges in a new venv, its versions
# written to requirements/constraints.txt and the layers' files (requirements/pin.py), then the
# whole suite reinstalled and run on them. A new moto stops the local stack until its patches are
# read again (devstack/agentq_dev/moto_version.py says how).
UPGRADE_VENV := .venv-upgrade
upgrade-deps:
	rm -rf $(UPGRADE_VENV)
	python3 -m venv $(UPGRADE_VENV)
	$(UPGRADE_VENV)/bin/python -m pip install -q --upgrade pip setuptools
	$(UPGRADE_VENV)/bin/python -m pip install -q -e ".[dev,bench]"
	$(UPGRADE_VENV)/bin/python requirements/pin.py --python $(UPGRADE_VENV)/bin/python
	rm -rf $(UPGRADE_VENV) $(VENV)
	$(MAKE) test

# python_exec runs model-written code only inside bubblewrap (agentq/sandbox/bwrap.py) and refuses
# to run it without. Installed from Debian's package where we can (root with apt-get); otherwise
# say how, and python_exec will answer every call with the same advice.
sandbox-tools:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing bubblewrap (python_exec's sandbox)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; \
	  else \
	    echo "python_exec needs bubblewrap: install the 'bubblewrap' package (e.g. sudo apt-get install bubblewrap)" >&2; \
	  fi; }

demo: $(VENV)/.local-installed sandbox-tools
	$(PY) -m agentq demo

# Six xdist workers (TEST_WORKERS), on two cores: most tests spend their time waiting on
# processes (a stack starting, a liveness lapsing, a killed worker's task resuming), so fewer
# workers leave the cores idle: 109 % of 200 % CPU and 776 s at -n 2 (a suite of 860 CPU-s),
# and now, with the suite at ~480-540 CPU-s (tests/conftest.py's fork server, racers forked
# from a pool, moto's fast paths): 151 % and 315 s at -n 4, 178 % and 299 s at -n 6 (quiet
# machine, a venv that had run the suite before); on a fresh clone, as CI runs it, 336 s
# (`CI=true bash .ci/run`, 2 cores, f8354f3). --dist loadgroup: tests/xdist_scheduling.py puts each module whose tests
# share a module-scoped fixture (a local stack, a browser, a synth) in one group, run by one
# worker, so that fixture starts once a run instead of once per worker (and the tests marked
# xdist_group in theirs: cdk, every test that loads the CDK's jsii runtime); every other test is
# scheduled on its own, the longest first (tests/durations.json, written by `make durations`),
# so the run does not end on one worker's 15 s tests. It also gives schemathesis' generated
# tests (tests/test_api_schema.py) node ids of their own, which group scheduling needs.
#
# Bytecode is cached for the run even where the environment says PYTHONDONTWRITEBYTECODE: the
# suite starts ~150 Python processes (workers, run-task, moto servers, racers, benches), and
# without a cache each compiled agentq from source again (~0.13 CPU-s a process), as each xdist
# worker did every test module under pytest's assertion rewriting (~6 CPU-s a worker).
# compileall first, so the workers' collection does not compile agentq once each at the same time.
test: $(VENV)/.installed sandbox-tools chromium
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m compileall -q -j 0 layers/agentq/python devstack >/dev/null
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# How long each test takes, as make test runs them: tests/durations.json, the order it hands out
# the tests that are not in a group (longest first). Rerun when tests have been added or changed
# speed; a stale file only balances the workers less well.
durations: PYTEST_ARGS += --store-durations
durations: test

# Debian's Chromium for the console's browser tests (tests/test_console.py), which Playwright
# drives; Playwright's own browser download is never used. Its old headless shell (Debian's
# chromium-headless-shell: the same Blink without the browser's windowing layers, what Playwright
# itself runs when headless) spent 14-23 % less CPU on tests/test_console.py than the full browser
# in --headless. Installs once, quietly (apt needs root, as on CI and the dev machines); a machine
# that has it does nothing, and one that cannot install it but has /usr/bin/chromium goes on with
# that (the tests fall back to it).
CHROMIUM ?= /usr/bin/chromium-headless-shell
chromium:
	@test -x $(CHROMIUM) || { \
		apt-get update -qq >/dev/null && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium-headless-shell >/dev/null; } || \
		{ test -x /usr/bin/chromium && echo "chromium-headless-shell not installed: the browser tests use /usr/bin/chromium"; }

# Re-take the README's console screenshots (docs/console/*.png) from the browser tests.
console-screenshots: $(VENV)/.installed chromium
	AGENTQ_CONSOLE_SCREENSHOTS=docs/console $(PY) -m pytest -q -n 0 tests/test_console.py tests/test_console_outcomes.py tests/test_console_policies_compare.py tests/test_console_quality.py

# Every check runs even when an earlier one fails, so one run reports everything; the target fails if any did.
lint: $(VENV)/.installed
	@rc=0; \
	$(VENV)/bin/ruff check . || rc=1; \
	$(VENV)/bin/ruff format --check . || rc=1; \
	$(VENV)/bin/mypy || rc=1; \
	PYTHONPATH=layers/agentq/python:devstack:. $(VENV)/bin/lint-imports || rc=1; \
	exit $$rc

# The import contracts alone (pyproject's [tool.importlinter], every one of them): the layers (core < storage
# < queueing < control < api, cli; the worker's composition through runtime the one edge ignored), the
# dispatch package's (a message's walk only goes down), agentq never importing the development stack
# (agentq_dev) but in the CLI's local-stack commands, and no import circle among our modules; `make lint`
# runs them too.
# The repository root is on the path for our own contract type (tests/import_cycles.py).
layers: $(VENV)/.installed
	PYTHONPATH=layers/agentq/python:devstack:. $(VENV)/bin/lint-imports

bench: $(VENV)/.bench-installed
	$(PY) bench/checkpoint_cost.py

# The chaos suite (bench/chaos.py): 200 tasks under random SIGKILL/SIGSTOP of 4 workers and a
# faulty model server, then every invariant checked; exits 1 naming what broke. CHAOS_ARGS to
# change it (e.g. CHAOS_ARGS="--tasks 50 --seed 3"). A smaller seeded run is in `make test`.
# CHAOS_ARGS="--scenario zombies" is issue 40's run (SIGSTOP past the lease only, replies cut
# midway): it fails on today's ledger, naming the trees charged more than was delivered.
chaos: $(VENV)/.installed
	$(PY) bench/chaos.py $(CHAOS_ARGS)

clean:
	rm -rf $(VENV) $(UPGRADE_VENV) cdk.out .pytest_cache .mypy_cache .ruff_cache
