"""Horovod's Adasum tests for PyTorch (test/parallel/test_adasum_pytorch.py, plus test_delta_optimizer of
test_torch.py), ported to hc in tests/workers/horovod_ported_adasum.py, on the CPU, with hc.init() alone and after
hvd.init().

Sizes: 2 and 4 (powers of two, where Horovod's expected value for parallel vectors, their average, is what Adasum
gives) and 3 (hc's fold of rank 2 into rank 0: test_orthogonal keeps Horovod's expectation, the parallel and
stability tests compare with the NumPy reference's fold under Horovod's tolerance, and report so).

Horovod's test functions and what became of them:

- test_orthogonal: ported (GPU-only in Horovod; run on the CPU, denominator 1 as Horovod's non-NCCL path).
- test_parallel: ported (GPU-only in Horovod; CPU here). Average at 2 and 4; the reference's fold at 3.
- test_stability: ported. Average at 2 and 4; the reference's fold at 3.
- test_stability_2: ported. Average at 2 and 4; the reference's fold at 3.
- test_torch.py::test_delta_optimizer: ported (GPU-only in Horovod; CPU here), with an added check that the step
  moved every parameter and kept it finite.
"""

from __future__ import annotations

import pytest
from mpi_harness import load_ranks, mpirun

PORTED = ["test_orthogonal", "test_parallel", "test_stability", "test_stability_2", "test_delta_optimizer"]
FOLDED = {"test_parallel", "test_stability", "test_stability_2"}  # Horovod's expectation needs a power of two


@pytest.fixture(scope="module", params=[(n, m) if n < 4 else pytest.param((n, m), marks=pytest.mark.long)
                                       for n in (2, 3, 4) for m in ("hc", "hvd")],
                ids=lambda p: f"n{p[0]}-{p[1]}")
def ranks(request, tmp_path_factory) -> tuple[int, str, list[dict]]:
    n, mode = request.param
    out = tmp_path_factory.mktemp(f"ported_adasum_{n}_{mode}")
    mpirun("horovod_ported_adasum.py", n, out, mode, timeout=300)
    return n, mode, load_ranks(out, n)


@pytest.mark.parametrize("name", PORTED)
def test_ported_horovod_adasum_test_passes_on_every_rank(ranks, name: str) -> None:
    n, mode, saved = ranks
    folded = n & (n - 1) != 0 and name in FOLDED
    for r, rk in enumerate(saved):
        got = rk["results"].get(name)
        if folded:
            assert got is not None and got.startswith("ok (") and "reference's fold" in got, f"n={n} {mode} {got}"
        else:
            assert got == "ok", f"n={n} {mode} rank {r}: {name}: {got}"
