"""Resume the Horovod way: rank 0 loads the checkpoint, then hvd.broadcast_parameters and
hvd.broadcast_optimizer_state (Horovod's own function, on an hvd_compress optimizer), or every rank loads rank 0's
file; 2, 3 and 4 ranks, real processes. Rank 0's file of hc.full_optimizer_state_dict (which every rank calls) holds
every rank's per-rank state: either resume from it equals the run never stopped, bit for bit, on every rank, for
every op. From a plain state_dict() of rank 0, every rank of an op with per-rank state warns at each resume.
Training goes on alike on every rank where the op keeps the ranks alike, bit for bit as after
hc.broadcast_optimizer_state, for every op past its warm-up. The error feedback in rank 0's checkpoint is rank 0's
residual: the other ranks start theirs from zero (a file loaded warns) and load the rest, so
each resume equals the run that loads rank 0's file with the other ranks' errors zeroed by hand (rank 0's error on
every rank would count it n times in the ranks' sum). A broadcast leaves each rank its own error feedback: in the
middle of a run where the rest of the state is alike on every rank, it changes nothing. Hierarchical Birder (all
ranks on one node here) keeps m and b of this rank's chunk only: another rank's are other elements' moments, so
they go as the error feedback does. The two broadcast resumes run as a new launch would (hc's runtime not started
before the wrapper is built): a local call of rank 0 alone that started it (its set-up is a collective) would wait
forever for the ranks waiting in Horovod's broadcast, which the worker's watchdog fails within a minute."""

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
#: Ops with state that is each rank's own: error feedback, Adasum's moments, SLAMB's local moments
PER_RANK = (*ERROR_FEEDBACK, "SLAMB", "Adasum")


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
            for mode in ("gathered", "gathered_file"):
                assert rk[f"{name} {mode}"] == rk[f"{name} full"], \
                    f"op={name} rank {r} of {n}: the resume from rank 0's full_optimizer_state_dict ({mode}) != the " \
                    "run never stopped"
            for mode in ("reference", "root_errors", "full", "midway", "gathered", "gathered_file"):
                assert not rk[f"{name} warnings {mode}"], f"op={name} rank {r} {mode}: {rk[f'{name} warnings {mode}']}"
            for mode in ("hvd", "hc"):  # rank 0's plain state_dict(): every rank says so, at every resume
                warned = rk[f"{name} warnings {mode}"]
                if name in PER_RANK:
                    assert len(warned) == 1 and "this resume is not exact" in warned[0] \
                        and "hc.full_optimizer_state_dict(opt)" in warned[0], f"op={name} rank {r} {mode}: {warned}"
                else:
                    assert not warned, f"op={name} rank {r} {mode}: {warned}"
            if name in PER_RANK:  # the check is not vacuous: the plain resume differs from the run never stopped
                assert any(k[f"{name} hc"] != k[f"{name} full"] for k in ranks), f"op={name}: plain resume was exact"
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
    for r, rk in enumerate(ranks):  # each load of another rank's file warns, not the first of the process only
        want = 0 if r == 0 else 2
        assert rk["warned per load"] == want, f"rank {r}: two loads of rank 0's file warned {rk['warned per load']}x"


def test_checkpoint_of_two_ranks_on_three_refused_or_reset_on_every_rank(out_dir) -> None:
    """Rank 0's checkpoint of 2 ranks resumed at 3 the Horovod way: where the op's state depends on the world size
    (1-bit Adam's server error, 0/1 Adam), one ValueError on every rank, raised by the broadcast every rank is in,
    that says how to recover; where only the per-rank state does (Adasum, PowerSGD), training goes on alike on every
    rank, each rank warning that its per-rank state was not restored."""
    mpirun("horovod_resume.py", 2, out_dir, "save", timeout=120)
    mpirun("horovod_resume.py", 3, out_dir, "load", timeout=120)
    ranks = load_ranks(out_dir, 3)
    for name in ("OneBitAdam", "ZeroOneAdam", "Adasum", "PowerSGD"):
        for kind in ("plain", "gathered"):
            key = f"{name} {kind} world"
            for r, rk in enumerate(ranks):
                got, warned = rk[key], rk[f"{key} warnings"]
                if name in ("OneBitAdam", "ZeroOneAdam"):
                    assert got.startswith("ValueError") and "written by a job of 2 ranks and this job has 3" in got \
                        and "launch 2 ranks" in got and "without hvd_compress's entries" in got, \
                        f"op={name} {kind} rank {r}: {got}"
                else:
                    assert got == "no error", f"op={name} {kind} rank {r}: {got}"
                    assert rk[f"{key} hashes"] == ranks[0][f"{key} hashes"], f"op={name} {kind}: rank {r} differs"
                    assert any("not exact" in w for w in warned), f"op={name} {kind} rank {r}: {warned}"
