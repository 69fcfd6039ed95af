# Two commands do all set-up: `make run` (the main job) and `make test` (the tests).
# Every install uses constraints.txt, the exact versions the suite was tested with.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HASH := $(shell cat setup.cfg pyproject.toml constraints.txt | cksum | cut -d' ' -f1)
# One venv, two stamps: `make run` installs what the main job needs (the recipes extra);
# `make test` and the other targets add the test and docs extras.
RUN_STAMP := $(VENV)/.installed-run-$(HASH)
TEST_STAMP := $(VENV)/.installed-test-$(HASH)

.PHONY: run test lint docs docs-serve bench notebooks upgrade clean

# Installs go through uv (pinned in constraints.txt: ~35 s against pip's ~65 s for the test
# extras on a fresh 2-core machine); where uv cannot be installed or fails, pip does the same.
# --compile-bytecode as pip does: where PYTHONDONTWRITEBYTECODE is set, nothing would ever
# write TensorFlow's .pyc files and every test process would import it in ~11 s, not ~5 s.
INSTALL = $(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python -c constraints.txt -e
PIP_INSTALL = $(BIN)/python -m pip install -q -c constraints.txt -e

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -c constraints.txt uv || $(BIN)/python -m pip install -q --upgrade pip

$(RUN_STAMP): setup.cfg pyproject.toml constraints.txt | $(VENV)/bin/python
	test -e $(TEST_STAMP) || $(INSTALL) ".[recipes]" || $(PIP_INSTALL) ".[recipes]"
	rm -f $(VENV)/.installed-run-*
	touch $(RUN_STAMP)

$(TEST_STAMP): setup.cfg pyproject.toml constraints.txt | $(VENV)/bin/python
	$(INSTALL) ".[test,recipes,docs]" || $(PIP_INSTALL) ".[test,recipes,docs]"
	rm -f $(VENV)/.installed-test-*
	touch $(TEST_STAMP)

run: $(RUN_STAMP)
	$(BIN)/python recipes/digits.py

lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The tests run on TEST_WORKERS processes (pytest-xdist, each file in one; 0: one process,
# no xdist). Tests marked `alone` time real jobs to name their limit, so they run after
# the others, in one process, on a CPU no other test loads. Three processes on two cores:
# many tests wait on the subprocesses they start (workers, servers, killed jobs), which a
# third process overlaps (the README gives the time measured on a fresh clone; four
# processes took longer: 929 s against 887 s, the Ray test 360 s against 218 s). Files go to
# the processes in collection order (--no-loadscope-reorder), which tests/conftest.py
# starts with the slowest files (SLOW_FILES).
TEST_WORKERS ?= 3
# The files that hold `alone` tests: that run collects only them (the whole suite's
# collection is ~15 s of CPU, the time-critical run's own start).
ALONE_FILES := $(shell grep -l "mark.alone" tests/test_*.py)

test: lint
ifeq ($(TEST_WORKERS),0)
	$(BIN)/python -m pytest -q --durations=15
else
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not alone" --durations=15
	$(BIN)/python -m pytest -q -m alone $(ALONE_FILES)
endif

# The documentation site (mkdocs.yml, docs/): --strict fails on a broken link or reference.
docs: $(TEST_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: $(TEST_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

bench: $(TEST_STAMP)
	$(BIN)/python benchmarks/data_pipeline.py
	$(BIN)/python benchmarks/trainer_vs_fit.py
	$(BIN)/python benchmarks/batch_size.py

# Re-execute the tutorials in notebooks/ in place, so that their stored outputs are fresh.
notebooks: $(TEST_STAMP)
	$(BIN)/python tests/test_notebooks.py

# Refresh the pins to the newest releases setup.cfg allows, then run the tests on them.
upgrade:
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q --upgrade uv -e ".[test,recipes,docs]"
	$(BIN)/python -m pip freeze --exclude-editable > constraints.txt
	touch $(VENV)/.installed-test-$$(cat setup.cfg pyproject.toml constraints.txt | cksum | cut -d' ' -f1)
	$(MAKE) test

clean:
	rm -rf $(VENV) runs build site *.egg-info
