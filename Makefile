# hvd_compress: `make demo` and `make test` do all the set-up themselves (see tools/install.sh).
PY ?= python3
NP ?= 4
NET ?=
BENCH_NP ?= 2
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))
export TF_CPP_MIN_LOG_LEVEL := 3
MPIRUN := mpirun --oversubscribe --bind-to none -x PYTHONPATH -x OMP_NUM_THREADS=1 -x TF_CPP_MIN_LOG_LEVEL

.PHONY: install build test lint demo bench clean

install:
	bash tools/install.sh

build:
	$(PY) setup.py -q build_ext --inplace -j2

lint: install
	$(PY) -m ruff check .

test: install lint
	$(PY) -m pytest -q -p no:cacheprovider tests

demo: install
	$(MPIRUN) -np $(NP) $(PY) examples/demo.py --out examples/out

bench: install
	NP=$(BENCH_NP) PY=$(PY) bash tools/bench.sh $(NET)

clean:
	rm -rf build hvd_compress/_core*.so hvd_compress/.core_built bench_results examples/out
