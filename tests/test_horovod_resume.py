"""Resume the Horovod way: rank 0 loads the checkpoint, then hvd.broadcast_parameters and
hvd.broadcast_optimizer_state (Horovod's own function, on an hvd_compress optimizer). Training goes on alike on every
rank, bit for bit as after hc.broadcast_optimizer_state, for 1-bit Adam in its compressed stage, Adasum and Average."""

from __future__ import annotations

from mpi_harness import load_ranks, mpirun


def test_hvd_broadcast_optimizer_state_resumes_hvd_compress_optimizers(out_dir) -> None:
    mpirun("horovod_resume.py", 2, out_dir, timeout=240)
    ranks = load_ranks(out_dir, 2)
    for name in ("OneBitAdam", "Adasum", "Average"):
        for r, rk in enumerate(ranks):
            assert rk[f"{name} hvd"] == "no error", f"op={name} rank {r}: resume raised {rk[f'{name} hvd']}"
            assert rk[name] == rk[f"{name} hc"], f"op={name} rank {r}: resumed unlike hc.broadcast_optimizer_state"
            assert rk[name] == ranks[0][name], f"op={name}: rank {r} parameters differ from rank 0 after resume"
