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
# allreduce (PowerSGD's too), flat Adasum, the broadcast, SLAMB's masked gather and average, DiLoCo's block-quantized
# allreduce, the hierarchical 1-bit collective (Birder, SignSGD, hierarchical=True), the sparse allreduce of
# compression=topk, allgather (called directly below).
THROUGH_TABLE = ("OneBitAdam", "OneBitLamb", "ZeroOneAdam", "Average", "Sum", "PowerSGD", "Adasum",
                 "broadcast_parameters", "SLAMB", "DiLoCo", "SignSGD", "Birder", "OneBitAdam hierarchical", "topk")
# The direct calls (tests/workers/device_table.py) and how many copies or waits each drops on rank 0.
DROPS = {"onebit": 7, "dense": 4, "masked": 4, "block_quant": 7, "hierarchical": 3, "allgather": 2, "topk": 3}


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
        assert set(rk["ops"]) >= {*THROUGH_TABLE, "SignSGD", "Adasum", "Birder"}
        # Exactly the payload (the worker's payload()): the 1-bit call's (3n + 1) wire blocks of a float32 scale and
        # C / 8 bytes of bits (C the padded chunk); the dense call's tensor out and back; the masked call's selected
        # values out and back; the block-quantized call's (3n + 1) chunks of int4 blocks; the flat hierarchical call's
        # bits; allgather's own rows; top-k's pairs.
        assert set(rk["calls"]) == set(DROPS), (r, n)
        for kind, got in rk["calls"].items():
            assert got["same"] and got["payload"] > 0 and got["host_bytes"] == got["payload"], (r, n, kind, got)
    drops = {d for rk in load_ranks(out_dir, n) for d in rk["drops"]}
    assert len(drops) == sum(DROPS.values()), drops
    for d in drops:
        # The drop is rank 0's: a wrong payload reaches every rank, a dropped last wait rank 0's own result.
        assert not all(rk["drops"][d] for rk in load_ranks(out_dir, n)), f"{n} ranks: dropping {d} went unnoticed"
