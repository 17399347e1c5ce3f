"""``opt.comm_stats()`` of the torch face holds all the bytes of the optimizer's calls: every op (and top-k
compression), with and without overlap and a GradScaler, Horovod's synchronize()/clip/step() recipe (whose
agreements on edited gradients and on the scaler's verdict are small allreduces of their own), and none of a
closure's own allreduce; 2, 3 and 4 ranks. The Keras faces' counterpart (hck.LossScaleOptimizer's finite checks) is
in test_tensorflow."""

from __future__ import annotations

import pytest
from mpi_harness import load_ranks, mpirun


@pytest.mark.parametrize("n", [2, 3, pytest.param(4, marks=pytest.mark.long)])
def test_comm_stats_counts_every_byte_of_the_optimizer_and_no_other(n: int, out_dir) -> None:
    mpirun("comm_stats.py", n, out_dir, timeout=300)
    ranks = load_ranks(out_dir, n)
    cases = [key for key in ranks[0] if "closure" not in key]
    ops = sorted({key[0] for key in ranks[0]})
    assert len(ops) == 11 and len(cases) == 9 * 2 * 2 + 2 * 2 + 3, cases
    for r, rk in enumerate(ranks):
        for case in cases:
            own, process = rk[case]
            assert process["bytes_sent"] > 0, f"{case} rank {r}: nothing sent"
            assert (own["bytes_sent"], own["bytes_received"]) == (process["bytes_sent"], process["bytes_received"]), \
                f"{case} rank {r}: comm_stats() {own} against the process's {process}"
        for op in ops:
            plain, averaged = rk[op, "closure", False], rk[op, "closure", True]
            assert plain[0]["bytes_sent"] == plain[1]["bytes_sent"] > 0, f"{op} rank {r}: {plain}"
            assert averaged[0] == plain[0], f"{op} rank {r}: the closure's allreduce counted: {averaged[0]} {plain[0]}"
            assert averaged[1]["bytes_sent"] > plain[1]["bytes_sent"], f"{op} rank {r}: the closure sent nothing"
