"""hvd_compress under horovodrun: it runs on Horovod's MPI world and agrees with Horovod's allreduce."""

from __future__ import annotations

from mpi_harness import horovodrun, load_ranks


def test_allreduce_matches_horovod_under_horovodrun(out_dir) -> None:
    n = 3
    horovodrun("horovod_compare.py", n, out_dir, timeout=180)
    for r, rk in enumerate(load_ranks(out_dir, n)):
        assert (rk["hc_rank"], rk["hc_size"]) == (rk["hvd_rank"], rk["hvd_size"]) == (r, n), rk
        for key, (ours, theirs) in ((k, v) for k, v in rk.items() if not isinstance(k, str)):
            err = (ours - theirs).abs().max().item() if ours.numel() else 0.0
            scale = theirs.abs().max().item() if theirs.numel() else 1.0
            assert err <= 1e-6 * max(scale, 1.0), f"rank {r} {key}: hc vs hvd max error {err:.3g}"
