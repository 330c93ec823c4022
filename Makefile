# Two commands do all set-up: `make run` and `make test` (see README.md).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: run test lint format venv install install-dev agents migrate demo worker web clean

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

migrate: install
	$(PY) manage.py migrate --noinput

# The example suite, the demo experiment and an admin account (password printed once).
demo: migrate
	$(PY) manage.py import_tasks --set examples examples/tasks
	$(PY) manage.py import_experiment examples/experiments/demo.yaml --root examples
	$(PY) manage.py import_experiment examples/experiments/smoke.yaml --root examples
	$(PY) manage.py ensure_admin

# Web server and one Celery worker on the embedded default (SQLite + filesystem broker).
run: demo
	@scripts/run_dev.sh $(HOST) $(PORT)

worker: install
	$(PY) -m celery -A evalsite worker --loglevel=INFO --concurrency=2

test: install-dev
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest $(PYTEST_ARGS)

lint: install-dev
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: install-dev
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

clean:
	rm -rf var/broker var/test-* var/staticfiles
