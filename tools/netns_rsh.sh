#!/usr/bin/env bash
# Open MPI's "remote shell" for tools/two_nodes.sh (mpirun --mca plm_rsh_agent): Open MPI calls it as
# `netns_rsh.sh [ssh options] HOST COMMAND...` to start its daemon (orted) on HOST. HOST is the address of an
# emulated node and the daemon starts in that node's network namespace, in a UTS namespace of its own whose
# hostname is the node's name (so that Open MPI's per-host files, e.g. the shared-memory segments named by
# hostname and local rank, do not collide between the two "nodes" of one machine).
# HVDC_NETNS_MAP: "ADDRESS=NAMESPACE ..." for every emulated node.
set -euo pipefail
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done  # ssh options (-x, ...): nothing to do
host=${1:?usage: netns_rsh.sh HOST COMMAND...}
shift
for pair in ${HVDC_NETNS_MAP:?HVDC_NETNS_MAP is not set}; do
    if [ "${pair%%=*}" = "$host" ]; then
        ns=${pair#*=}
        exec ip netns exec "$ns" unshare --uts /bin/sh -c "hostname $ns && $*"
    fi
done
echo "netns_rsh.sh: no namespace for host $host in HVDC_NETNS_MAP='$HVDC_NETNS_MAP'" >&2
exit 1
