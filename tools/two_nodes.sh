#!/usr/bin/env bash
# Two emulated nodes on one machine (for paper 004's hierarchical all-reduce): network namespaces A and B
# joined by a veth pair whose ends are each rate-limited by `tc qdisc ... tbf` (RATE, default 1gbit; netem is
# not available here), 2 ranks per node: ranks 0-1 in A, 2-3 in B. Open MPI sees two hosts, 10.77.0.1 (A) and
# 10.77.0.2 (B): mpirun runs in A, and starts B's daemon through tools/netns_rsh.sh, which enters B. Inside a
# node the ranks talk over shared memory (vader), between the nodes over TCP on the veth pair only (BTL and
# OOB restricted to 10.77.0.0/24); HVDC_LOCAL_SIZE=2 gives hvd_compress the same node split, and Horovod finds
# it through MPI_Comm_split_type(SHARED) (one host each). Each node has its own UTS namespace and hostname.
#
#   tools/two_nodes.sh [RATE]                 (make bench-two-nodes)
#   tools/two_nodes.sh RATE -- PROGRAM ARGS... (any program on the 4 ranks instead, once)
#
# Runs `python -m hvd_compress.bench` REPEATS times (default 3) with BENCH_ARGS (e.g. --only/--sizes), each
# run writing bench_results/bench_2nodes-RATE-rK_np4.{json,md}, then the medians over the runs
# (hvd_compress/bench/repeats.py) into bench_results/bench_2nodes-RATE_np4.md. The namespaces and the veth
# pair are removed on exit, also on failure or interrupt.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-python3}
RATE=${1:-1gbit}
TBF_LATENCY=${TBF_LATENCY:-50ms}  # tbf queue: at most this long at RATE (its byte limit)
YIELD=${YIELD:-1}
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
program=("$@")
REPEATS=${REPEATS:-3}
eval "args=(${BENCH_ARGS:-})"
tag=$$
nsa="hvdc2n-a-$tag" nsb="hvdc2n-b-$tag"
addr_a=10.77.0.1 addr_b=10.77.0.2
cleanup() {
    ip netns del "$nsa" 2>/dev/null || true  # deleting a namespace deletes its veth end, and so the pair
    ip netns del "$nsb" 2>/dev/null || true
}
trap cleanup EXIT INT TERM
ip netns add "$nsa"
ip netns add "$nsb"
ip link add "v2n_a$tag" netns "$nsa" type veth peer name "v2n_b$tag" netns "$nsb"
for side in "a $nsa $addr_a" "b $nsb $addr_b"; do
    set -- $side
    ip netns exec "$2" ip link set lo up
    ip netns exec "$2" ip addr add "$3/24" dev "v2n_$1$tag"
    ip netns exec "$2" ip link set "v2n_$1$tag" up
    ip netns exec "$2" tc qdisc add dev "v2n_$1$tag" root tbf rate "$RATE" burst 256kb latency "$TBF_LATENCY"
done
echo "[two-nodes] $nsa ($addr_a) <-> $nsb ($addr_b): veth, each end tbf rate $RATE burst 256kb latency $TBF_LATENCY"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
export TF_CPP_MIN_LOG_LEVEL=3 HVDC_LOCAL_SIZE=2 HVDC_BENCH_NET="2nodes-$RATE" HOROVOD_CPU_OPERATIONS=MPI
export HVDC_NETNS_MAP="$addr_a=$nsa $addr_b=$nsb"
mpi=(mpirun --host "$addr_a:2,$addr_b:2" -np 4 --bind-to none
     --mca plm_rsh_agent "$here/tools/netns_rsh.sh" --mca plm_rsh_no_tree_spawn 1 --mca mpi_yield_when_idle "$YIELD"
     --mca btl self,vader,tcp --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24
     -x PYTHONPATH -x OMP_NUM_THREADS=1 -x TF_CPP_MIN_LOG_LEVEL -x HVDC_LOCAL_SIZE -x HVDC_BENCH_NET
     -x HOROVOD_CPU_OPERATIONS ${HVDC_TIMEOUT:+-x HVDC_TIMEOUT})
in_a() { ip netns exec "$nsa" unshare --uts /bin/sh -c "hostname $nsa && exec \"\$@\"" sh "$@"; }
if [ ${#program[@]} -gt 0 ]; then
    in_a "${mpi[@]}" "${program[@]}"
    exit 0
fi
out="$here/bench_results"
mkdir -p "$out"
labels=()
for k in $(seq 1 "$REPEATS"); do
    label="2nodes-$RATE-r$k"
    labels+=("$out/bench_${label}_np4.json")
    in_a "${mpi[@]}" "$PY" -m hvd_compress.bench --out "$out" --label "$label" --kernel-dtypes '' "${args[@]}"
done
"$PY" -m hvd_compress.bench.repeats --out "$out/bench_2nodes-${RATE}_np4.md" "${labels[@]}"
# SAVE=1: each run's stamped JSON into docs/bench-data/ (make bench-docs renders it; the medians are derived).
if [ "${SAVE:-}" = 1 ]; then
    mkdir -p "$here/docs/bench-data"
    cp -v "${labels[@]}" "$here/docs/bench-data/"
fi
