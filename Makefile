# Two commands do all set-up: `make run` and `make test` (see README.md).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: run test lint format venv install install-dev agents browser sandbox containers coder-eval ripgrep migrate demo worker web clean

$(PY):
	$(PYTHON) scripts/bootstrap_venv.py $(VENV)

$(VENV)/.installed: requirements.txt | $(PY)
	$(PY) -m pip install --disable-pip-version-check -q -r requirements.txt
	touch $@

$(VENV)/.installed-dev: requirements.txt requirements-dev.txt | $(PY)
	$(PY) -m pip install --disable-pip-version-check -q -r requirements-dev.txt
	touch $(VENV)/.installed $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

# The real agent CLIs (Claude Code, Codex, Gemini CLI, opencode) from npm, into node_modules/ (skipped without npm).
node_modules/.installed: package.json package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
		npm ci --no-audit --no-fund --loglevel=error && touch $@; \
	else \
		echo "npm not found: the claude-code and codex agents (and their tests) are unavailable"; \
	fi

# Aider (PyPI) in its own virtualenv: its hundreds of pinned dependencies stay out of .venv.
.agents/aider/.installed: requirements-agents.txt | $(PY)
	rm -rf .agents/aider
	$(PY) -m venv .agents/aider
	.agents/aider/bin/python -m pip install --disable-pip-version-check -q $$(grep -m1 '^aider-chat==' requirements-agents.txt)
	touch $@

# opencode: its platform's binary package alone, into .agents/opencode (the `opencode-ai` wrapper
# lists every platform's package, which the registry does not all serve, so `npm ci` could not
# check a lock file holding it).
OPENCODE_VERSION := 1.18.33
OPENCODE_ARCH := $(shell uname -m | sed -e 's/x86_64/x64/' -e 's/aarch64/arm64/')
.agents/opencode/.installed: Makefile
	@if command -v npm >/dev/null 2>&1; then \
		rm -rf .agents/opencode && mkdir -p .agents/opencode/bin && \
		npm install --no-save --no-package-lock --no-audit --no-fund --loglevel=error \
			--prefix .agents/opencode opencode-linux-$(OPENCODE_ARCH)@$(OPENCODE_VERSION) && \
		ln -s ../node_modules/opencode-linux-$(OPENCODE_ARCH)/bin/opencode .agents/opencode/bin/opencode && \
		touch $@; \
	else \
		echo "npm not found: the opencode agent (and its test) is unavailable"; \
	fi

# opencode's grep and glob tools run ripgrep, which it would otherwise download (sandboxes have
# no network): Debian's, installed when missing and apt-get can.
ripgrep:
	@if ! command -v rg >/dev/null 2>&1; then \
		if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
			(apt-get install -y -q ripgrep >/dev/null 2>&1 || \
			 (apt-get update -q >/dev/null && apt-get install -y -q ripgrep >/dev/null)) && \
			echo "installed ripgrep"; \
		else \
			echo "ripgrep (rg) missing and cannot be installed here: opencode's grep and glob tools will fail"; \
		fi; \
	fi

agents: node_modules/.installed .agents/aider/.installed .agents/opencode/.installed ripgrep

# Debian's chromium for the Playwright tests (installed when missing and apt-get can).
browser:
	@if [ ! -x /usr/bin/chromium ]; then \
		if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
			(apt-get install -y -q chromium >/dev/null 2>&1 || \
			 (apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null)) && \
			echo "installed chromium"; \
		else \
			echo "chromium missing and cannot be installed here: browser tests will be skipped"; \
		fi; \
	fi

# bubblewrap: every trial command runs in its namespace sandbox (installed when missing and
# apt-get can; without it workers refuse to run trials, saying what to install).
sandbox:
	@if ! command -v bwrap >/dev/null 2>&1; then \
		if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
			(apt-get install -y -q bubblewrap >/dev/null 2>&1 || \
			 (apt-get update -q >/dev/null && apt-get install -y -q bubblewrap >/dev/null)) && \
			echo "installed bubblewrap"; \
		else \
			echo "bubblewrap (bwrap) missing and cannot be installed here: install it to run trials"; \
		fi; \
	fi
	@if ! command -v cc >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		(apt-get install -y -q gcc libc6-dev >/dev/null 2>&1 || \
		 (apt-get update -q >/dev/null && apt-get install -y -q gcc libc6-dev >/dev/null)) && echo "installed gcc"; \
	fi
	@mkdir -p .build && cc -O2 -Wall -o .build/evalsite-launch runs_app/engine/sandbox/launcher/evalsite-launch.c

# Container tasks (sandbox.driver: docker): Debian's docker.io installed where root and apt-get can,
# dockerd started unless one answers, and the offline images their Dockerfiles start from, each
# built once (scripts/containers.sh; logs in var/log/). Fails only where the engine should run.
containers:
	@scripts/containers.sh

# coder-eval 0.12.16 (the format's reference) in .agents/coder-eval, for the tests and the parity
# bench that check evalsite against it (needs Python 3.13; skipped with a message without one).
coder-eval:
	@scripts/install_coder_eval.sh

migrate: install
	$(PY) manage.py migrate --noinput

# The example suite, the demo experiment and an admin account (password printed once).
demo: migrate
	$(PY) manage.py import_tasks --set examples examples/tasks
	$(PY) manage.py import_experiment examples/experiments/demo.yaml --root examples --keep-existing
	$(PY) manage.py import_experiment examples/experiments/smoke.yaml --root examples --keep-existing
	$(PY) manage.py ensure_admin --password-file var/admin-password

# Web server and one Celery worker on the embedded default (SQLite + filesystem broker). The
# container engine before the worker (which looks for it when it starts), its images in the
# background; the agent CLIs (`make agents`, minutes on a fresh machine) install in the background
# once the site is up (scripts/install_agents.sh; the Workers page shows how far it got). The first
# page waits for neither.
run: demo sandbox
	@scripts/containers.sh --background || echo "containers: unavailable (var/log/containers.log): container tasks will be refused"
	@SITE_URL=$${SITE_URL:-http://$(HOST):$(PORT)} scripts/run_dev.sh $(HOST) $(PORT)

worker: install sandbox
	$(PY) -m celery -A evalsite worker --loglevel=INFO $(if $(WORKER_SLOTS),,--concurrency=2)

test: install-dev agents browser sandbox containers coder-eval
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m mypy
	$(PY) -m pytest $(PYTEST_ARGS)

# ruff, the import contracts of pyproject.toml ([tool.importlinter]) and the type checker ([tool.mypy]).
lint: install-dev
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(VENV)/bin/lint-imports --no-cache
	$(PY) -m mypy

format: install-dev
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

clean:
	rm -rf var/broker var/test-* var/staticfiles
