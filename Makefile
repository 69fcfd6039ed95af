# Two commands do all set-up: `make run` (the main job) and `make test` (the tests).
# Every install uses constraints.txt, the exact versions the suite was tested with.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
EXTRAS := test,recipes,docs
STAMP := $(VENV)/.installed-$(shell cat setup.cfg pyproject.toml constraints.txt | cksum | cut -d' ' -f1)

.PHONY: run test lint docs docs-serve bench notebooks upgrade clean

$(STAMP): setup.cfg pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[$(EXTRAS)]"
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/python recipes/digits.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The tests run on TEST_WORKERS processes (pytest-xdist, each file in one; 0: one process,
# no xdist). Tests marked `alone` time real jobs to name their limit, so they run after
# the others, in one process, on a CPU no other test loads.
TEST_WORKERS ?= 2

test: lint
ifeq ($(TEST_WORKERS),0)
	$(BIN)/python -m pytest -q --durations=15
else
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not alone" --durations=15
	$(BIN)/python -m pytest -q -m alone
endif

# The documentation site (mkdocs.yml, docs/): --strict fails on a broken link or reference.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

bench: $(STAMP)
	$(BIN)/python benchmarks/data_pipeline.py
	$(BIN)/python benchmarks/trainer_vs_fit.py
	$(BIN)/python benchmarks/batch_size.py

# Re-execute the tutorials in notebooks/ in place, so that their stored outputs are fresh.
notebooks: $(STAMP)
	$(BIN)/python tests/test_notebooks.py

# Refresh the pins to the newest releases setup.cfg allows, then run the tests on them.
upgrade:
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q --upgrade -e ".[$(EXTRAS)]"
	$(BIN)/python -m pip freeze --exclude-editable > constraints.txt
	touch $(VENV)/.installed-$$(cat setup.cfg pyproject.toml constraints.txt | cksum | cut -d' ' -f1)
	$(MAKE) test

clean:
	rm -rf $(VENV) runs build site *.egg-info
