#!/usr/bin/env bash
# Runs COMMAND (an mpirun line) with every rank in a fresh network namespace whose loopback `tc tbf` limits to
# RATE, so that one machine behaves like nodes behind a slow link. Inside, Open MPI is forced over TCP on that
# loopback (byte transfer and out-of-band alike; its MCA settings travel as OMPI_MCA_* variables, which mpirun
# reads like --mca options) and Horovod's CPU collectives run over MPI; HVDC_BENCH_NET names the rate for the
# programs (hvd_compress/bench/e2e.py, examples/demo.py). netem is not used: tbf alone is what this kernel has.
# The namespace is removed on exit, also on failure or interrupt. Needs root and `ip netns` (iproute2);
# `tools/slow_link.sh RATE true` says whether this machine allows it.
#
#   tools/slow_link.sh RATE COMMAND...     (RATE as tc writes it: 1gbit, 100mbit)
set -euo pipefail
RATE=${1:?usage: slow_link.sh RATE COMMAND...}
shift
[ $# -gt 0 ] || { echo "usage: slow_link.sh RATE COMMAND..." >&2; exit 2; }
ns="hvdc_link_$$"
cleanup() { ip netns del "$ns" 2>/dev/null || true; }
trap cleanup EXIT INT TERM
ip netns add "$ns"
ip netns exec "$ns" ip link set lo up
ip netns exec "$ns" tc qdisc add dev lo root tbf rate "$RATE" burst 256kb latency 50ms
echo "[slow-link] namespace $ns: loopback limited to $RATE (tbf burst 256kb latency 50ms); MPI over TCP"
export OMPI_MCA_btl=tcp,self OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
export HOROVOD_CPU_OPERATIONS=MPI HVDC_BENCH_NET="$RATE"
ip netns exec "$ns" "$@"
