"""A gradient that is None on some ranks only (a branch the loss takes by rank) under the TF faces' Average: left
out as Keras leaves a None gradient, it makes the ranks' buckets differ, so the reduction raises ``MismatchError``
on every rank (no hang, no silent step) and names the cause and the fix; with the fix (zero gradients for
unconnected variables) the ranks end alike. ``hck.DistributedOptimizer`` and ``hc.DistributedGradientTape``, eager
custom loops, 2 and 3 ranks."""

from __future__ import annotations

import pytest
from mpi_harness import load_pickled_ranks, mpirun


@pytest.mark.parametrize("n", [2, 3])
def test_gradients_none_on_some_ranks_raise_on_every_rank_naming_the_fix(n: int, out_dir) -> None:
    mpirun("tf_none_gradients.py", n, out_dir, timeout=240)
    ranks = load_pickled_ranks(out_dir, n)
    for path in ("optimizer", "tape"):
        for r, rk in enumerate(ranks):
            got = rk[(path, "NONE")]
            assert got.startswith("MismatchError") and "left out" in got, f"{path} rank {r}: {got}"
            assert "tf.zeros_like(v) if g is None" in got and "UnconnectedGradients.ZERO" in got, f"{path} {r}: {got}"
        fixed = {rk[(path, "ZERO")] for rk in ranks}
        assert len(fixed) == 1 and "Error" not in next(iter(fixed)), f"{path} with zero gradients: {fixed}"
