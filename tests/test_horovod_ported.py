"""Horovod's own PyTorch tests (test/parallel/test_torch.py), ported to hc in tests/workers/horovod_ported.py,
at 2 and 3 ranks, with hc.init() alone and after hvd.init(); plus the sparse optimizers against a
single-process reference on the concatenated batch."""

from __future__ import annotations

import itertools

import pytest
import torch
from mpi_harness import load_ranks, mpirun

PORTED = [
    "test_horovod_allreduce",
    "test_horovod_allreduce_average",
    "test_horovod_allreduce_inplace",
    "test_horovod_allreduce_async_fused",
    "test_horovod_allreduce_prescale",
    "test_horovod_allreduce_postscale",
    "test_horovod_allreduce_error",
    "test_horovod_allreduce_type_error",
    "test_horovod_allreduce_grad",
    "test_horovod_allreduce_grad_average",
    "test_horovod_allreduce_min",
    "test_horovod_allreduce_max",
    "test_horovod_allreduce_product",
    "test_horovod_grouped_allreduce",
    "test_horovod_grouped_allreduce_average",
    "test_horovod_grouped_allreduce_inplace",
    "test_horovod_grouped_allreduce_grad",
    "test_horovod_allgather",
    "test_horovod_allgather_variable_size",
    "test_horovod_allgather_async_fused",
    "test_horovod_allgather_error",
    "test_horovod_allgather_type_error",
    "test_horovod_allgather_grad",
    "test_horovod_broadcast",
    "test_horovod_broadcast_inplace",
    "test_horovod_broadcast_error",
    "test_horovod_broadcast_type_error",
    "test_horovod_broadcast_rank_error",
    "test_broadcast_object",
    "test_allgather_object",
    "test_force_allreduce",
    "test_gradient_clipping",
    "test_synchronize_step_warning",
    "test_no_named_parameters",
    "test_missing_named_parameters",
    "test_duplicate_names",
    "test_dynamic_requires_grad",
    "test_process_sets_global_only",
    "test_rejected_input_is_usage_and_runtime_error",
    "test_sparse_adam",
    "test_sparse_as_dense",
]


@pytest.fixture(scope="module", params=[(2, "hc"), (3, "hc"), (2, "hvd"), (3, "hvd")], ids=lambda p: f"n{p[0]}-{p[1]}")
def ranks(request, tmp_path_factory) -> tuple[int, str, list[dict]]:
    n, mode = request.param
    out = tmp_path_factory.mktemp(f"ported_{n}_{mode}")
    mpirun("horovod_ported.py", n, out, mode, timeout=400)
    return n, mode, load_ranks(out, n)


@pytest.mark.parametrize("name", PORTED)
def test_ported_horovod_test_passes_on_every_rank(ranks, name: str) -> None:
    n, mode, saved = ranks
    for r, rk in enumerate(saved):
        assert rk["results"].get(name) == "ok", f"n={n} {mode} rank {r}: {name}: {rk['results'].get(name)}"


def _reference(n: int, sparse_as_dense: bool) -> list[torch.Tensor]:
    """One process stepping on the concatenation of every rank's batch (the loss is a mean over the batch, so
    the averaged gradient of n equal-sized batches is the gradient on their concatenation)."""
    torch.manual_seed(7)
    emb = torch.nn.Embedding(20, 4, sparse=not sparse_as_dense)
    head = torch.nn.Linear(4, 1)
    emb_opt = (torch.optim.Adam if sparse_as_dense else torch.optim.SparseAdam)(list(emb.parameters()), lr=0.05)
    head_opt = torch.optim.SGD(head.parameters(), lr=0.1)
    for step in range(3):
        idx = torch.cat([torch.randint(0, 20, (5,), generator=torch.Generator().manual_seed(100 * step + r))
                         for r in range(n)])
        emb_opt.zero_grad()
        head_opt.zero_grad()
        (head(emb(idx)).squeeze(1) - idx.float() / 10).pow(2).mean().backward()
        emb_opt.step()
        head_opt.step()
    return [emb.weight.detach(), head.weight.detach(), head.bias.detach()]


@pytest.mark.parametrize("key", ["sparse_adam", "sparse_as_dense"])
def test_sparse_optimizers_match_one_process_on_the_concatenated_batch(ranks, key: str) -> None:
    n, mode, saved = ranks
    want = _reference(n, key == "sparse_as_dense")
    for r, rk in enumerate(saved):
        assert key in rk, f"n={n} {mode} rank {r}: {rk['results'].get('test_' + key)}"
        for i, (got, w) in enumerate(itertools.zip_longest(rk[key], want)):
            err = float((got - w).abs().max())
            assert err <= 1e-5, f"n={n} {mode} rank {r}: {key} parameter {i} off by {err:.3g}"
