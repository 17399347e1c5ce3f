"""Horovod's entry points accept hvd_compress's ops (and Horovod's own ops stay Horovod's); switchable off."""

from __future__ import annotations

import pytest
import torch
from mpi_harness import load_ranks, mpirun


@pytest.mark.parametrize("n", [2, 3])
def test_hvd_distributed_optimizer_and_allreduce_route_our_ops_to_hc(n: int, out_dir) -> None:
    mpirun("horovod_entry.py", n, out_dir, "on", timeout=240)
    ranks = load_ranks(out_dir, n)
    for r, rk in enumerate(ranks):
        assert rk["hvd_onebit"] == rk["hc_onebit"], f"n={n} rank {r}: hvd.DistributedOptimizer(op=OneBitAdam) != hc's"
        assert rk["hvd_onebit"] == ranks[0]["hvd_onebit"], f"n={n}: rank {r} parameters differ from rank 0"
        assert rk["types"][:2] == [True, True], f"rank {r}: not hc wrappers: {rk['types']}"
        ours, ref = rk["adasum"]
        assert torch.equal(ours, ref), f"n={n} rank {r}: hvd.allreduce(op=hc.Adasum) is not hc's Adasum"
        theirs, ref = rk["hvd_average"]
        assert torch.allclose(theirs, ref, atol=1e-6), f"n={n} rank {r}: Horovod's own Average changed"
        assert rk["off"].startswith("TypeError") and "freeze_step" in rk["off"], f"rank {r}: {rk['off']}"
        assert rk["types"][-1] is False, f"rank {r}: Horovod's own optimizer was not Horovod's"


def test_environment_switch_leaves_horovod_untouched(out_dir) -> None:
    mpirun("horovod_entry.py", 2, out_dir, "off", env={"HVDC_HOROVOD_ENTRY": "0"}, timeout=240)
    for r, rk in enumerate(load_ranks(out_dir, 2)):
        assert rk["off"].startswith("TypeError") and "freeze_step" in rk["off"], f"rank {r}: {rk['off']}"
