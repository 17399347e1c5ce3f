"""``state_dict()`` between ``backward()`` and ``step()`` under the bucketed ops with overlap (1-bit Adam, 0/1 Adam,
Birder, SLAMB; 2, 3 and 4 ranks): the buckets reduced during backward have already changed their state in place,
and the checkpoint holds it as of the last step taken, so a resume that takes that step again ends bit for bit as
the run never stopped (``workers/mid_step_checkpoint.py``). PowerSGD and top-k/random-k, whose state the reduction
changes with no copy from before, warn there that the checkpoint holds half a step."""

from __future__ import annotations

import pytest
from mpi_harness import load_ranks, mpirun


@pytest.mark.parametrize("n", [2, 3, pytest.param(4, marks=pytest.mark.long)])
def test_checkpoint_between_backward_and_step_resumes_exactly(n: int, out_dir) -> None:
    mpirun("mid_step_checkpoint.py", n, out_dir, timeout=300)
    for r, rk in enumerate(load_ranks(out_dir, n)):
        for op in ("PowerSGD", "TopK"):
            between, after = rk.pop(op)
            assert len(between) == 1 and "holds half a step" in between[0], \
                f"op={op} rank {r} of {n}: state_dict() between a reduction and step() warned {between}"
            assert not after, f"op={op} rank {r} of {n}: state_dict() after step() warned {after}"
        for op, (full, resumed) in rk.items():
            differ = [i for i, (a, b) in enumerate(zip(full, resumed, strict=True)) if a != b]
            assert not differ, f"op={op} rank {r} of {n}: resumed from the mid-step checkpoint, steps {differ} differ"
