"""``opt.step(closure)`` runs the closure before anything is reduced, under every engine: the gradients its
backward computes are the ones the ranks average, so the parameters equal those of ``closure(); opt.step()`` bit
for bit on every rank, and ``step`` returns the closure's loss. (Reducing first and handing the closure to the
wrapped optimizer, as Horovod's wrapper does, steps on each rank's own gradients: with overlap=False the ranks
come apart.) 2 and 3 ranks."""

from __future__ import annotations

import pytest
from mpi_harness import load_ranks, mpirun

CASES = ["Average", "Average:nooverlap", "PowerSGD", "PowerSGD:nooverlap", "OneBitAdam", "Adasum"]


@pytest.mark.parametrize("n", [2, 3])
def test_step_with_a_closure_reduces_the_gradients_the_closure_computed(n: int, out_dir) -> None:
    mpirun("closure_step.py", n, out_dir, ",".join(CASES), timeout=180)
    ranks = load_ranks(out_dir, n)
    for case in CASES:
        got = [(rk[(case, "plain")], rk[(case, "closure")]) for rk in ranks]
        bad = [g for pair in got for g in pair if isinstance(g, str)]
        assert not bad, f"{case}: {bad}"
        assert len({plain[0] for plain, _ in got}) == 1, f"{case}: ranks differ without a closure"
        for r, (plain, closure) in enumerate(got):
            assert closure[0] == plain[0], f"{case} rank {r} of {n}: step(closure) differs from closure(); step()"
            assert len(closure[1]) == 4 and all(v is not None and v > 0 for v in closure[1]), closure[1]
