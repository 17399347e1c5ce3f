"""The device table (cpp/include/hvdc/device.h) from Python: every op through hc.DistributedOptimizer (with
compression=topk and hierarchical=True too), broadcast_parameters and allgather, on the staged test device at
2, 3 and 4 ranks give the parameters of the plain CPU run bit for bit; the ops whose collectives go through the table
copy host bytes there; and one copy or wait dropped on one rank changes the parameters (the C++ side:
cpp/tests/test_device_table.cc)."""

from __future__ import annotations

import importlib.util

import pytest
from mpi_harness import load_ranks, mpirun

# The ops whose collectives go through the table: the 1-bit allreduce (and the dense one in warm-up), the dense
# allreduce (PowerSGD's too), flat Adasum, the broadcast, the hierarchical 1-bit collective (Birder, SignSGD,
# hierarchical=True), the sparse allreduce of compression=topk, allgather (called directly below). The others'
# collectives (SLAMB's masked) run on the CPU's table whatever the test device; they must still give the same bits.
NUMEL = 1000  # the direct calls' elements (tests/workers/device_table.py)
THROUGH_TABLE = ("OneBitAdam", "OneBitLamb", "ZeroOneAdam", "Average", "Sum", "PowerSGD", "Adasum",
                 "broadcast_parameters", "SignSGD", "Birder", "OneBitAdam hierarchical", "topk")


@pytest.mark.parametrize("n", [2, 3, 4])
def test_staged_device_equals_cpu_and_catches_a_dropped_copy_or_wait(n: int, out_dir) -> None:
    mpirun("device_table.py", n, out_dir, timeout=240)
    cuda_built = importlib.util.find_spec("hvd_compress._cuda") is not None
    for r, rk in enumerate(load_ranks(out_dir, n)):
        assert rk["cuda_table"] is True or not cuda_built, f"rank {r} of {n}: {rk['cuda_table']}"
        for op, got in rk["ops"].items():
            assert got["same"], f"rank {r} of {n}: {op} on the staged device differs from the CPU run"
            if op in THROUGH_TABLE:
                assert got["host_bytes"] > 0, f"rank {r} of {n}: {op} copied no host bytes: not through the table"
        assert set(rk["ops"]) >= {*THROUGH_TABLE, "SignSGD", "Adasum", "Birder", "SLAMB"}
        # Exactly the payload: the 1-bit call's (3n + 1) wire blocks of a float32 scale and C / 8 bytes of bits
        # (C the padded chunk); the dense call's tensor out and back.
        chunk = -(-NUMEL // (8 * n)) * 8
        assert rk["calls"]["onebit"] == {"same": True, "host_bytes": (3 * n + 1) * (4 + chunk // 8)}, (r, n)
        assert rk["calls"]["dense"] == {"same": True, "host_bytes": 2 * 4 * NUMEL}, (r, n)
        # The flat hierarchical call: the worker's bits out, n pieces of C / 8n bytes in, the served piece out, the
        # chunk's bits in; allgather: this rank's r + 1 rows of 12 bytes out; top-k: k = 100 pairs of 8 bytes out,
        # n k in.
        piece = -(-NUMEL // (8 * n))
        assert rk["calls"]["hierarchical"] == {"same": True, "host_bytes": (3 * n + 1) * piece}, (r, n)
        assert rk["calls"]["allgather"] == {"same": True, "host_bytes": 12 * (r + 1)}, (r, n)
        assert rk["calls"]["topk"] == {"same": True, "host_bytes": 8 * 100 * (1 + n)}, (r, n)
    drops = {d for rk in load_ranks(out_dir, n) for d in rk["drops"]}
    assert len(drops) == 19, drops
    for d in drops:
        # The drop is rank 0's: a wrong payload reaches every rank, a dropped last wait rank 0's own result.
        assert not all(rk["drops"][d] for rk in load_ranks(out_dir, n)), f"{n} ranks: dropping {d} went unnoticed"
