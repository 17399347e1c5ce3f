"""A tensor in CUDA memory reaches the core's one DLPack translation (cpp/include/hvdc/dlpack_view.h) and is refused
there on every rank, naming its device, without a hang and without touching any rank's buffer; the ranks keep
working after it. Ranks holding the same tensor on different device types therefore raise (the CUDA path is not
wired yet). Hand-made DLPack capsules stand for CUDA tensors: no GPU is needed."""

from __future__ import annotations

import pytest
from mpi_harness import load_ranks, mpirun


@pytest.mark.parametrize("n", [2, 3])
def test_cuda_tensor_on_one_rank_is_refused_on_every_rank(n: int, out_dir) -> None:
    mpirun("cuda_capsule.py", n, out_dir, timeout=120)
    for r, rk in enumerate(load_ranks(out_dir, n)):
        c = rk["caught"]
        assert c["mixed"].startswith("RejectedInputError"), f"rank {r} of {n}: {c['mixed']}"
        assert "rank 1 rejected its input" in c["mixed"] and "tensor is on cuda:1" in c["mixed"], f"rank {r}: {c}"
        assert "CPU tensors only" in c["mixed"], f"rank {r} of {n}: {c['mixed']}"
        assert c["mixed_unchanged"] == str([float(r + 1)] * 5), f"rank {r} of {n}: buffer changed {c}"
        assert c["all"].startswith("RejectedInputError") and "cuda:0" in c["all"], f"rank {r} of {n}: {c['all']}"
        assert c["recovered"] == str([float(sum(range(n)))] * 3), f"rank {r} of {n}: after the errors {c}"
