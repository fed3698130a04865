# Two commands work on a fresh machine: `make demo` and `make test`. Each creates .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LINTED := src tests benchmarks examples

.PHONY: demo test check lint bench bench-full size clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

lint: $(STAMP)
	$(VENV)/bin/ruff format --check $(LINTED)
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/pyright

test: lint size
	$(VENV)/bin/pytest

check: test

# The side-by-side suite (benchmarks/README.md); peers run where benchmarks/setup_peers.sh made
# them. bench: the quick suite; bench-full: every configuration, state 1024 included.
bench: $(STAMP)
	$(PY) benchmarks/run_suite.py --quick

bench-full: $(STAMP)
	$(PY) benchmarks/run_suite.py

size:
	@wc -l src/batchfold/graph.py src/batchfold/opbase.py src/batchfold/ops.py src/batchfold/ops_matrix.py src/batchfold/grouping.py src/batchfold/schedule.py src/batchfold/execute.py | sort -n

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
