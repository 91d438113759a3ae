# plait: two commands on a fresh machine.
#   make test   set up .venv (once) and run the whole check suite: ruff, mypy, import-linter, pytest
#   make bench  set up .venv (once) and run the ResNet benchmark (eager, plait, torch.compile)
#   make coverage  sweep PyTorch's OpInfo samples through plait.compile; writes docs/coverage.md
#   make docs   the documentation site with its API reference (build/docs), --strict: a warning fails
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: test bench coverage docs lint typecheck layers pytest setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[dev,bench,tvm]'
	# NOTE: the zoo's torchvision and timm models: timm without its dependencies (it would pull
	# the CUDA torchvision), torchvision's Python files only (benchmarks/model_sources.py)
	$(BIN)/python -m pip install --quiet --no-deps -c constraints.txt timm
	$(BIN)/python -m benchmarks.model_sources fetch
	touch $(STAMP)

# NOTE: tests take tolerances from the numerical contract: a numeric atol/rtol outside
# tests/contract fails lint (tools/check_test_tolerances.py)
lint: $(STAMP)
	$(BIN)/ruff check src tests tools $(wildcard benchmarks)
	$(BIN)/ruff format --check src tests tools $(wildcard benchmarks)
	$(BIN)/python tools/check_test_tolerances.py tests

typecheck: $(STAMP)
	$(BIN)/mypy

layers: $(STAMP)
	$(BIN)/lint-imports

# NOTE: the torch.compile(backend="plait") tests run in processes of their own: in a worker that
# ran other tests first, Dynamo was once seen handing module parameters as plain inputs (an
# order dependence not yet found; results stay within the contract).
DYNAMO_TESTS := tests/test_dynamo_backend.py "tests/test_doctests.py::test_docstring_examples[plait.dynamo_backend]"
# NOTE: bytecode compiled once: where PYTHONDONTWRITEBYTECODE is set, every process the tests
# start (warm starts, concurrent compiles) would otherwise compile plait's modules again
pytest: $(STAMP)
	$(BIN)/python -m compileall -q -j 2 src benchmarks tools > /dev/null
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 --dist loadgroup -q --ignore tests/test_dynamo_backend.py --deselect "tests/test_doctests.py::test_docstring_examples[plait.dynamo_backend]"
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 --dist loadgroup -q $(DYNAMO_TESTS)

# NOTE: the guides in docs/ and the API reference from the docstrings (mkdocs.yml); a broken link
# or a docstring the reference cannot read is a warning, and --strict makes it an error
docs: $(STAMP)
	$(BIN)/mkdocs build --strict --quiet

test: lint typecheck layers docs pytest

bench: $(STAMP)
	$(BIN)/python -m benchmarks.resnet_classification --out benchmarks/out

coverage: $(STAMP)
	OMP_NUM_THREADS=1 $(BIN)/python -m benchmarks.opinfo_coverage

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
