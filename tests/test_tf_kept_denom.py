"""The TF faces' 1-bit step keeps the frozen denominator across steps (tensorflow.algorithm_step._KeptDenom) and
reuses it only for the same frozen v: another run's checkpoint restored into an optimizer that kept one steps
bit for bit as a fresh optimizer restored from it (1-bit Adam and 1-bit LAMB, 2 ranks)."""

from __future__ import annotations

from mpi_harness import load_pickled_ranks, mpirun


def test_kept_frozen_denominator_is_not_reused_after_restoring_another_runs_checkpoint(out_dir) -> None:
    mpirun("tf_kept_denom.py", 2, out_dir, timeout=300)
    for r, rk in enumerate(load_pickled_ranks(out_dir, 2)):
        for op in ("OneBitAdam", "OneBitLamb"):
            assert rk[op]["compression_started"], (r, op)
            assert rk[op]["restored_into_b"] == rk[op]["fresh_c"], f"rank {r}, {op}: a stale frozen denominator"
