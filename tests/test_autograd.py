"""Autograd through hc.allreduce / hc.grouped_allreduce: the gradient of a reduction is the same reduction
of the incoming gradient, as in Horovod (its test_horovod_allreduce_grad and grouped_allreduce_grad)."""

from __future__ import annotations

import numpy as np
import pytest
from mpi_harness import load_ranks, mpirun

from hvd_compress import reference


@pytest.mark.parametrize(("n", "mode"), [(2, "hc"), (3, "hc"), (3, "hvd")])
def test_allreduce_gradient_is_the_same_reduction_of_the_upstream_gradient(n: int, mode: str, out_dir) -> None:
    mpirun("autograd.py", n, out_dir, mode, timeout=180)
    ranks = load_ranks(out_dir, n)
    for opname in ("Sum", "Average"):
        for r, rk in enumerate(ranks):
            ones = rk[f"ones.{opname}"].double().numpy()
            want = n if opname == "Sum" else 1.0  # Horovod's expected value
            assert np.allclose(ones, want, rtol=0, atol=1e-6), f"n={n} rank {r} {opname}: grad {ones[:3]}"
        coefs = [rk[f"coef.{opname}"][0].double().numpy() for rk in ranks]
        want = reference.allreduce([2.0 * c for c in coefs], op=opname, dtype="float32")
        for r, rk in enumerate(ranks):
            got = rk[f"coef.{opname}"][1].double().numpy()
            assert np.allclose(got, want[r], rtol=1e-6, atol=1e-6), f"n={n} rank {r} {opname}: {got} vs {want[r]}"
        for i, dtype in enumerate(("float32", "float64")):
            want = reference.allreduce([rk[f"group.{opname}"][0][i].double().numpy() for rk in ranks], op=opname,
                                       dtype=dtype)
            for r, rk in enumerate(ranks):
                got = rk[f"group.{opname}"][1][i].double().numpy()
                assert np.allclose(got, want[r], rtol=1e-6, atol=1e-9), f"n={n} rank {r} grouped {opname} {i}"
