"""A rank that exits normally (its script ends, or sys.exit(0)) while its peers still train: the survivors raise
PeerExitedError naming that rank and the collective they waited in, within seconds of its exit (not at
HVDC_TIMEOUT, and not Open MPI's abort for a call after MPI_Finalize), in a Horovod-style torch loop (op=Average,
OneBitAdam and Adasum through hvd.DistributedOptimizer) and in Keras model.fit; in torch a collective after that
raises PeerExitedError naming the first failure."""

from __future__ import annotations

import re

import pytest
from mpi_harness import mpirun

N = 2
QUICK_S = 60.0  # the survivors' error must come this soon after the peer's exit (well under HVDC_TIMEOUT's 300 s)


def _run(out_dir, how: str, face: str) -> str:
    res = mpirun("peer_exits.py", N, out_dir, how, face, timeout=240, check=False)
    out = res.stdout
    assert res.returncode != 0, f"{face} {how}: the job ended normally although a rank left mid-training:\n{out}"
    finished = re.findall(rf"rank {N - 1} finished its \d+ steps at ([\d.]+)", out)
    assert finished, f"{face} {how}: the last rank did not finish its steps:\n{out[-4000:]}"
    for r in range(N - 1):
        raised = re.findall(rf"rank {r} raised (\w+) at ([\d.]+)", out)
        assert raised, f"{face} {how}: rank {r} raised nothing:\n{out[-4000:]}"
        late = float(raised[0][1]) - float(finished[0])
        assert late < QUICK_S, f"{face} {how}: rank {r} raised {late:.0f} s after rank {N - 1} left"
    assert "after MPI_FINALIZE" not in out, f"{face} {how}: Open MPI's abort instead of our error:\n{out[-4000:]}"
    assert f"rank {N - 1} left the job" in out, f"{face} {how}: no error naming the rank that left:\n{out[-4000:]}"
    return out


@pytest.mark.parametrize(("how", "op"), [("return", "OneBitAdam"), ("sys.exit", "Average"), ("return", "Adasum")])
def test_torch_survivor_names_the_rank_that_left_and_the_collective(how: str, op: str, out_dir) -> None:
    out = _run(out_dir, how, op)
    assert "PeerExitedError" in out, out[-4000:]
    # The collective the survivor waited in, by name (the optimizer's bucket, Adasum's delta), before the message.
    collective = {"OneBitAdam": "OneBitAdam.m.", "Average": "DistributedOptimizer.grad.",
                  "Adasum": "DistributedOptimizer.adasum."}[op]
    # An algorithm's bucket names end in a hash of its hyper-parameters (@ and 8 hex digits).
    collective = re.escape(collective) + r"\d+(@[0-9a-f]{8})?"
    assert re.search(rf"{collective}: rank {N - 1} left the job", out), out[-4000:]
    # A collective after that says why this process cannot communicate any more: the peer left, not a timeout.
    for r in range(N - 1):
        assert re.search(rf"rank {r} then raised PeerExitedError: an earlier collective failed \("
                         rf"{collective}: rank {N - 1} left the job", out), out[-4000:]


def test_keras_fit_survivor_names_the_rank_that_left_and_the_collective(out_dir) -> None:
    pytest.importorskip("tensorflow")
    out = _run(out_dir, "return", "keras")
    assert re.search(rf"OneBitAdam\S*: rank {N - 1} left the job", out), out[-4000:]
