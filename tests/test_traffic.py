"""Byte accounting per call: every core collective reports the bytes this rank moved for it."""

from __future__ import annotations

import pytest
from mpi_harness import load_ranks, mpirun

SIGNATURE_BYTES = 256  # sizeof(hvdc::CallSignature), exchanged with every peer by every call


@pytest.mark.parametrize("n", [2, 3])
def test_meter_counts_its_own_calls_while_another_thread_communicates(n: int, out_dir) -> None:
    mpirun("traffic.py", n, out_dir, timeout=120)
    for r, rk in enumerate(load_ranks(out_dir, n)):
        alone, other, meter, total = rk["alone"], rk["other"], rk["meter"], rk["total"]
        # One float32 allreduce: the ring model plus one signature per peer.
        for counts, numel in ((alone, 1000), (other, 1 << 16)):
            want = int(2 * (n - 1) / n * 4 * numel) + SIGNATURE_BYTES * (n - 1)
            # host_bytes: a CPU tensor's collective copies nothing between a device and the host.
            assert counts == {"bytes_sent": want, "bytes_received": want, "calls": 1, "host_bytes": 0}, \
                f"rank {r} of {n}: {counts}"
        # The other thread's allreduce ran inside the meter's run() but is not the meter's.
        assert meter == {k: alone[k] for k in ("bytes_sent", "bytes_received")}, f"rank {r} of {n}: {meter}"
        # The process-wide totals are the sum of the per-call counts.
        assert total == {k: alone[k] + other[k] + alone[k] for k in alone}, f"rank {r} of {n}: {total}"
