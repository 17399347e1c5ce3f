"""Resume the Horovod way: rank 0 loads the checkpoint, then hvd.broadcast_parameters and
hvd.broadcast_optimizer_state (Horovod's own function, on an hvd_compress optimizer), or every rank loads rank 0's
file; 2, 3 and 4 ranks, real processes. Training goes on alike on every rank where the op keeps the ranks alike, bit
for bit as after hc.broadcast_optimizer_state, for every op past its warm-up. The error feedback in rank 0's
checkpoint is rank 0's residual: the other ranks start theirs from zero (a file loaded warns) and load the rest, so
each resume equals the run that loads rank 0's file with the other ranks' errors zeroed by hand (rank 0's error on
every rank would count it n times in the ranks' sum). A broadcast leaves each rank its own error feedback: in the
middle of a run where the rest of the state is alike on every rank, it changes nothing. Hierarchical Birder (all
ranks on one node here) keeps m and b of this rank's chunk only: another rank's are other elements' moments, so
they go as the error feedback does."""

from __future__ import annotations

import pytest
from mpi_harness import load_ranks, mpirun

OPS = ["OneBitAdam", "OneBitLamb", "ZeroOneAdam", "Birder", "BirderHierarchical", "SignSGD", "PowerSGD", "TopK",
       "SLAMB", "Adasum", "Average"]
#: Ops whose state holds error feedback (the others have none to start afresh)
ERROR_FEEDBACK = OPS[:8]
#: Ops whose ranks step apart between syncs by design (0/1 Adam's local steps, SLAMB's local moments)
APART = ("ZeroOneAdam", "SLAMB")
#: Ops whose state is alike on every rank but for the error feedback (Birder's m and b, Adasum's moments are each
#: rank's own, so rank 0's differ), or but for what is this rank's alone: hierarchical Birder's shards of m and b,
#: of this rank's chunk, which a broadcast leaves as the error feedback
ALIKE = ("OneBitAdam", "OneBitLamb", "BirderHierarchical", "SignSGD", "PowerSGD", "TopK", "Average")


@pytest.mark.parametrize("n", [2, 3, pytest.param(4, marks=pytest.mark.long)])
def test_horovod_resume_takes_rank_zeros_state_and_this_ranks_error_feedback(n: int, out_dir) -> None:
    mpirun("horovod_resume.py", n, out_dir, timeout=300)
    ranks = load_ranks(out_dir, n)
    for name in OPS:
        for r, rk in enumerate(ranks):
            assert rk[f"{name} hvd"] == "no error", f"op={name} rank {r}: resume raised {rk[f'{name} hvd']}"
            for mode in ("hc", "file", "reference"):
                assert rk[name] == rk[f"{name} {mode}"], f"op={name} rank {r} of {n}: the Horovod resume != {mode}"
            if name not in APART:
                assert rk[name] == ranks[0][name], f"op={name}: rank {r} parameters differ from rank 0 after resume"
            for mode in ("hvd", "hc", "reference", "root_errors", "full", "midway"):
                assert not rk[f"{name} warnings {mode}"], f"op={name} rank {r} {mode}: {rk[f'{name} warnings {mode}']}"
            if name in ALIKE:
                assert rk[f"{name} midway"] == rk[f"{name} full"], f"op={name} rank {r}: a broadcast midway changed it"
            warned = rk[f"{name} warnings file"]
            if name in ERROR_FEEDBACK and r != 0:
                what = "error feedback and its chunk's m and b" if name == "BirderHierarchical" else "error feedback"
                assert len(warned) == 1 and f"rank {r} starts its {what} from zero" in warned[0], \
                    f"op={name} rank {r}: {warned}"
                # the check is not vacuous: rank 0's error on this rank steps otherwise
                assert rk[f"{name} root_errors"] != rk[f"{name} reference"], f"op={name} rank {r}: error was zero"
            else:
                assert not warned, f"op={name} rank {r}: {warned}"
