# Two commands: `make demo` (set up and run the example DAG) and `make test` (set up and run the tests; the slow
# statistical, scale and real-scheduler tests are `make test-slow`, and CI runs both).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test test-slow test-all demo-reset benchmarks clean

# uv (from PyPI) resolves and installs the same versions as pip, in about a quarter of the time; it compiles the
# bytecode at install as pip does (else the first processes of the suite compile the same modules side by side).
$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet uv

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python -e ".[test]"
	touch $@

demo: $(VENV)/.installed
	bash scripts/demo.sh

demo-reset:
	rm -rf .demo

# One pytest-xdist worker per core; an idle worker steals queued tests from a busy one. Each worker has its own
# Airflow home, PostgreSQL databases and roles, temporary files and ports (tests/conftest.py, tests/ledger_backends.py).
# PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= auto
PARALLEL = -n $(PYTEST_WORKERS) --dist worksteal

# Every test but those marked `slow` (pyproject.toml, ADR 30): the statistical tests with millions of draws, the exact
# references of the calibration, the real scheduler, the tutorial, the SQL and Parquet example DAGs, the live-tries
# race. They take about half as long again; CI runs them.
test: $(VENV)/.installed
	$(BIN)/python -m pytest $(PARALLEL) -m "not slow" $(PYTEST_ARGS)

test-slow: $(VENV)/.installed
	$(BIN)/python -m pytest $(PARALLEL) -m slow $(PYTEST_ARGS)

# Both in one pytest run.
test-all: $(VENV)/.installed
	$(BIN)/python -m pytest $(PARALLEL) $(PYTEST_ARGS)

benchmarks: $(VENV)/.installed
	$(BIN)/python benchmarks/noise_efficiency.py
	$(BIN)/python benchmarks/anonymity_adult.py
	$(BIN)/python benchmarks/consistency.py
	$(BIN)/python benchmarks/ledger_throughput.py
	$(BIN)/python benchmarks/ledger_cli.py
	$(BIN)/python benchmarks/privacy_blocks.py
	$(BIN)/python benchmarks/samplers.py
	$(BIN)/python benchmarks/large_release.py
	$(BIN)/python benchmarks/vector_release.py
	$(BIN)/python benchmarks/inline_publication.py
	$(BIN)/python benchmarks/startup.py
	$(BIN)/python benchmarks/dashboard_queries.py
	$(BIN)/python benchmarks/continual.py
	$(BIN)/python benchmarks/continual_decoder.py
	$(BIN)/python benchmarks/series_steps.py
	$(BIN)/python benchmarks/contribution_bounding.py
	$(BIN)/python benchmarks/quantiles.py

clean:
	rm -rf $(VENV) .demo .cache build *.egg-info
