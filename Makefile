# lazytpu: `make demo` and `make test` each set up their own virtualenv.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-opinfo test-contract coverage soak fuzz dtype-sweep arg-sweep value-sweep mixed-sweep lint venv clean bench notebooks

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, pinned: an unpinned resolve would pull a multi-GB CUDA build
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/demo.py

# The default run includes a fixed slice of the OpInfo sweep (tests/test_opinfo.py). It runs in
# TEST_WORKERS processes (pytest-xdist), a test file per worker at a time: 2 fits the 2-core CI machine.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/python -m pytest -q --timeout=900 --durations=15 -n $(TEST_WORKERS) --dist loadfile tests

# The full OpInfo sweep: every op_db entry in every supported dtype, gradients, a strict-mode sample
# (not run by CI: .ci/run runs `make test`).
test-opinfo: $(STAMP)
	LAZYTPU_OPINFO=full $(BIN)/python -m pytest -q --timeout=900 tests/test_opinfo.py

# The aliasing contract's full matrix: every write form through every view op and to the base
# (the default run applies a rotating sixth of the forms per view op).
test-contract: $(STAMP)
	LAZYTPU_CONTRACT=full $(BIN)/python -m pytest -q --timeout=900 tests/test_aliasing_contract.py

# Op coverage table over op_db: docs/coverage.md and docs/coverage.json.
coverage: $(STAMP)
	$(BIN)/python -m lazytpu.tools.coverage --quiet > /dev/null

# 2000 defer-mode training steps, then 3000 distinct shapes: memory, graph and caches must hold flat.
soak: $(STAMP)
	$(BIN)/python examples/soak.py 2000
	$(BIN)/python examples/shapes_soak.py 3000

# A long differential-fuzzing campaign of aliasing programs, with and without bad calls (random seed).
fuzz: $(STAMP)
	FUZZ_EXAMPLES=$${FUZZ_EXAMPLES:-5000} FUZZ_RANDOM=1 $(BIN)/python -m pytest -q -s tests/test_fuzz_aliasing.py tests/test_fuzz_errors.py

# Ops that CPU torch rejects for a dtype and tpu computes (a survey, not a test).
dtype-sweep: $(STAMP)
	$(BIN)/python tests/dtype_sweep.py

# Calls with an out-of-range dim or a wrong index dtype that CPU torch rejects and tpu computes (a survey, not a test).
arg-sweep: $(STAMP)
	$(BIN)/python tests/arg_sweep.py

# Ops whose tpu dtype or values differ from CPU torch's for operands of two float dtypes (a survey, not a test).
mixed-sweep: $(STAMP)
	$(BIN)/python tests/mixed_sweep.py

# Ops and modules whose tpu values differ from CPU torch's (a survey, not a test; options in tests/value_sweep.py).
value-sweep: $(STAMP)
	$(BIN)/python tests/value_sweep.py --dtypes float32,uint8,int8,int16,int32,int64,bool
	$(BIN)/python tests/value_sweep.py --modules

# The benchmark suite (benchmarks/README.md): table on stdout, JSON + PNG in benchmarks/results/.
bench: $(STAMP)
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python -m benchmarks

# Execute every notebook (tests/test_notebooks.py); executed copies, outputs included, go to notebooks/_build/.
# Notebook 03 renders its graph when Graphviz's `dot` is installed and prints the DOT text otherwise.
notebooks: $(STAMP)
	NOTEBOOKS_OUT=notebooks/_build $(BIN)/python -m pytest -q tests/test_notebooks.py

lint: $(STAMP)
	$(BIN)/ruff check lazytpu tests examples
	$(BIN)/ruff format --check lazytpu tests examples

clean:
	rm -rf $(VENV) *.egg-info
