"""torch.optim.SparseAdam over an nn.Embedding(sparse=True) under hc.DistributedOptimizer, in Horovod's plain
training loop, with and without sparse_as_dense: the same parameters as Horovod's own DistributedOptimizer at
2 ranks (Horovod gives SparseAdam the reduced gradient back sparse under sparse_as_dense; so does hc)."""

from __future__ import annotations

import pytest
from mpi_harness import load_ranks, mpirun


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("sparse_adam")
    mpirun("sparse_adam_horovod.py", 2, out, timeout=240)
    return load_ranks(out, 2)


@pytest.mark.parametrize("sparse_as_dense", [False, True], ids=["allgather", "sparse_as_dense"])
def test_sparse_adam_matches_horovod(saved, sparse_as_dense: bool) -> None:
    n = 2
    for r, rk in enumerate(saved):
        assert rk[("hc_error", sparse_as_dense)] == "no error", f"rank {r}: {rk[('hc_error', sparse_as_dense)]}"
        got, want = rk[("hc", sparse_as_dense)].numpy(), rk[("hvd", sparse_as_dense)].numpy()
        err = abs(got - want).max()
        assert err <= 1e-6, f"n={n} rank {r} sparse_as_dense={sparse_as_dense}: off Horovod by {err:.3g}"
        assert abs(want - rk[("hvd", not sparse_as_dense)].numpy()).max() <= 1e-6, "the two modes should agree"
