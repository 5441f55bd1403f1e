# The two commands a newcomer needs: `make demo` and `make test`. Both set up what they need.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
DEMO_STAMP := $(VENV)/.demo-stamp
NODE_STAMP := tests/clients/node_modules/.installed-stamp
# NeMo Gym, whose own code the Gym tests run against this server. Its wheel declares Python >= 3.13
# but its capture code runs on 3.11, so it is installed without that check and without its
# dependencies (the few its capture code imports are this project's: pydantic, orjson, openai).
GYM_VERSION := 0.7.0
GYM_STAMP := $(VENV)/.gym-$(GYM_VERSION)-stamp

.PHONY: demo serve test lint test-fast bench soak venv node chromium phoenix gym-launcher clean

venv: $(STAMP) $(GYM_STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# The demo needs only the server and the openai SDK that drives it: no Ray, browser or test tools.
$(DEMO_STAMP): pyproject.toml setup.py | $(PY)
	$(PY) -m pip install --quiet -e '.[demo]'
	touch $(DEMO_STAMP)

# The tests need everything (their extras include the demo's).
$(STAMP): pyproject.toml setup.py | $(PY)
	$(PY) -m pip install --quiet -e '.[test,tito]'
	touch $(STAMP) $(DEMO_STAMP)

$(GYM_STAMP): $(STAMP)
	$(PY) -m pip install --quiet --ignore-requires-python --no-deps 'nemo-gym==$(GYM_VERSION)'
	touch $(GYM_STAMP)

# Real agent clients (opencode, Codex CLI) for the end-to-end tests.
node: $(NODE_STAMP)

$(NODE_STAMP): tests/clients/package.json
	cd tests/clients && npm install --no-audit --no-fund --loglevel=error
	touch $(NODE_STAMP)

# The viewer's browser tests drive Debian's chromium (never a downloaded browser). Installed here when
# missing and we are root; otherwise stop and say what to run.
CHROMIUM ?= /usr/bin/chromium
chromium:
	@if [ -x "$(CHROMIUM)" ]; then :; \
	elif [ "$$(id -u)" = 0 ]; then apt-get update && apt-get install -y chromium; \
	else echo "chromium is missing: run as root: apt-get update && apt-get install -y chromium" >&2; exit 1; fi

# Arize Phoenix for tests/integration/test_phoenix.py, in a venv of its own: it pulls many packages
# whose pins would fight the project's. The version docs/observability.md describes.
PHOENIX_VENV    ?= .venv-phoenix
PHOENIX_VERSION := 20.26.1
PHOENIX_STAMP   := $(PHOENIX_VENV)/.installed-$(PHOENIX_VERSION)
phoenix: $(PHOENIX_STAMP)

$(PHOENIX_STAMP):
	rm -rf $(PHOENIX_VENV)
	$(PYTHON) -m venv $(PHOENIX_VENV)
	$(PHOENIX_VENV)/bin/python -m pip install --quiet 'arize-phoenix==$(PHOENIX_VERSION)'
	touch $(PHOENIX_STAMP)

# NeMo Gym 0.7.0 with all its dependencies (Ray, Hydra, uv, ...) in a Python 3.13 venv of its own, so
# that tests/integration/test_gym_launcher.py runs Gym's own launcher (`gym env start`, `gym eval run`)
# unchanged. Gym declares Python >= 3.13.14; the newest 3.13 pyenv has is used with
# --ignore-requires-python (and for Gym's server venvs, uv resolves as 3.13.14: tests/support/gym_launcher.py).
# Without any 3.13 this prints why and the test skips.
# Gym's own server venvs and uv's cache live in GYM_CACHE, kept between runs so a warm run reuses them.
# Cost (2 cores): this venv 1 min 45 s cold (1.5 GB); the test 4 min 10 s cold (uv's cache: 3.1 GB), 2.5 min warm.
GYM_LAUNCHER_VENV := .venv-gym
# Fixed: tests/support/gym_launcher.py keeps its cache in this folder.
GYM_CACHE         := .cache/gym
GYM_PYTHON        ?= $(shell ls -d "$$(pyenv root 2>/dev/null)"/versions/3.13.*/bin/python3.13 2>/dev/null | sort -V | tail -n 1)
GYM_LAUNCHER_STAMP := $(GYM_LAUNCHER_VENV)/.installed-$(GYM_VERSION)
gym-launcher:
	@if [ -z "$(GYM_PYTHON)" ]; then \
	    echo "gym-launcher: no Python 3.13 found (pyenv versions/3.13.*); the Gym launcher test will skip" >&2; \
	else $(MAKE) --no-print-directory $(GYM_LAUNCHER_STAMP); fi

$(GYM_LAUNCHER_STAMP):
	rm -rf $(GYM_LAUNCHER_VENV)
	$(GYM_PYTHON) -m venv $(GYM_LAUNCHER_VENV)
	$(GYM_LAUNCHER_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(GYM_LAUNCHER_VENV)/bin/python -m pip install --quiet --ignore-requires-python 'nemo-gym[telemetry]==$(GYM_VERSION)' uv
	touch $(GYM_LAUNCHER_STAMP)

demo: $(DEMO_STAMP)
	$(VENV)/bin/switchyard-model demo

serve: $(DEMO_STAMP)
	$(VENV)/bin/switchyard-model demo --serve

# Lint and format check first (fast), then the whole suite.
test: $(STAMP) $(GYM_STAMP) node chromium phoenix gym-launcher lint
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# Unit tests only: no processes, no node clients.
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not integration"

bench: $(STAMP)
	$(PY) bench/run.py
	$(PY) bench/scale.py

# Bounded soak: 3 min of mixed, faulty load; exits 1 if an invariant fails. SOAK_ARGS=--quick for 30 s.
soak: $(STAMP)
	$(PY) bench/soak.py $(SOAK_ARGS)

clean:
	rm -rf $(VENV) $(PHOENIX_VENV) $(GYM_LAUNCHER_VENV) $(GYM_CACHE) tests/clients/node_modules switchyard-captures .pytest_cache
