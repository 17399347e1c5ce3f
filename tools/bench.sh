#!/usr/bin/env bash
# Runs `python -m hvd_compress.bench` under mpirun. With a rate (e.g. `tools/bench.sh 1gbit`) the
# ranks run behind tools/slow_link.sh: inside a network namespace whose loopback is rate-limited by tc
# tbf, MPI forced over TCP on that loopback; the namespace is removed afterwards, also on failure.
#
# BENCH_ENV="VAR=value ..." exports settings to every rank, for both our collectives and Horovod's
# (e.g. BENCH_ENV=HOROVOD_CYCLE_TIME=20); the label, and so the result file, then names them.
# BENCH_ARGS="..." is passed on to the benchmark (e.g. BENCH_ARGS='--only "allreduce Adasum"').
# BENCH_MODULE picks the benchmark: hvd_compress.bench (collectives, the default) or hvd_compress.bench.e2e
# (end-to-end training steps; `make bench-e2e`).
# SAVE=1 copies the JSON the run wrote into docs/bench-data/, from which `make bench-docs` builds
# docs/benchmarks.md; each JSON is stamped with the commit, machine, network and ranks (hvd_compress/bench/stamp.py).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-python3}
NP=${NP:-2}
NET=${1:-}
MODULE=${BENCH_MODULE:-hvd_compress.bench}
export HVDC_BENCH_NET="$NET" HVDC_BENCH_ENV="${BENCH_ENV:-}"
out="$here/bench_results"
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
export TF_CPP_MIN_LOG_LEVEL=3
# mpi_yield_when_idle: as the Makefile's MPIRUN (docs/benchmarks.md): with 2 ranks on 2 cores Open MPI counts no
# oversubscription and spins in every blocking wait, Horovod's idle background cycles included, which slows
# every method's step (the local step without communication too); at 4 ranks it yields anyway.
export OMPI_MCA_mpi_yield_when_idle=1  # BENCH_ENV=OMPI_MCA_mpi_yield_when_idle=0 measures without it
mpi=(mpirun --oversubscribe --bind-to none -x OMPI_MCA_mpi_yield_when_idle -np "$NP" -x PYTHONPATH -x OMP_NUM_THREADS=1 -x HVDC_BENCH_NET
     -x HVDC_BENCH_ENV)
suffix=""
for kv in ${BENCH_ENV:-}; do
    export "${kv?}"
    mpi+=(-x "${kv%%=*}")
    suffix+="_${kv//=/}"
done
eval "args=(${BENCH_ARGS:-})"
marker=$(mktemp)
trap 'rm -f "$marker"' EXIT
if [ -z "$NET" ]; then
    "${mpi[@]}" "$PY" -m "$MODULE" --out "$out" --label "shm$suffix" "${args[@]}"
else
    bash "$here/tools/slow_link.sh" "$NET" \
        "${mpi[@]}" "$PY" -m "$MODULE" --out "$out" --label "$NET$suffix" "${args[@]}"
fi
if [ "${SAVE:-}" = 1 ]; then
    mkdir -p "$here/docs/bench-data"
    find "$out" -maxdepth 1 -name '*.json' ! -name '*.partial.json' -newer "$marker" -exec cp -v {} "$here/docs/bench-data/" \;
fi
