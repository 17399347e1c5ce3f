"""hvd_compress under horovodrun: it runs on Horovod's MPI world, agrees with Horovod's allreduce, and its
DistributedOptimizer trains in a Horovod loop (the other optimizer tests launch their workers with mpirun)."""

from __future__ import annotations

import torch
from mpi_harness import horovodrun, load_ranks


def test_allreduce_and_optimizer_match_horovod_under_horovodrun(out_dir) -> None:
    n = 3
    horovodrun("horovod_compare.py", n, out_dir, timeout=180)
    ranks = load_ranks(out_dir, n)
    for r, rk in enumerate(ranks):
        assert (rk["hc_rank"], rk["hc_size"]) == (rk["hvd_rank"], rk["hvd_size"]) == (r, n), rk
        trained = rk["train"]
        assert torch.allclose(trained["Average"], trained["hvd"], rtol=0, atol=1e-6), f"rank {r}: Average vs hvd"
        for name, params in trained.items():
            assert torch.equal(params, ranks[0]["train"][name]), f"rank {r}: {name} differs from rank 0"
        for key, (ours, theirs) in ((k, v) for k, v in rk.items() if not isinstance(k, str)):
            err = (ours - theirs).abs().max().item() if ours.numel() else 0.0
            scale = theirs.abs().max().item() if theirs.numel() else 1.0
            assert err <= 1e-6 * max(scale, 1.0), f"rank {r} {key}: hc vs hvd max error {err:.3g}"
