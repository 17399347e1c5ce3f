"""A Horovod user's code gives Horovod's answers in hc: op constants, grouped default, re-wrapping,
integer broadcasts and the gradient-clipping pattern, with hc.init() alone and after hvd.init()."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from mpi_harness import load_ranks, mpirun

from hvd_compress import reference
from hvd_compress.torch.wrapping import SYNC_WARNING


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    inp = torch.randn(4, 6, generator=g)
    return inp, inp.sum(dim=1, keepdim=True) * 3.0


def _local_grads(params: list[torch.Tensor], step: int, rank: int) -> list[np.ndarray]:
    model = torch.nn.Linear(6, 1)
    with torch.no_grad():
        for p, v in zip(model.parameters(), params, strict=True):
            p.copy_(v)
    inp, target = _batch(step, rank)
    torch.nn.functional.mse_loss(model(inp), target).backward()
    return [p.grad.double().numpy() for p in model.parameters()]


def _reduced(params: list[torch.Tensor], step: int, n: int, op: str) -> list[np.ndarray]:
    per_rank = [_local_grads(params, step, r) for r in range(n)]
    return [reference.allreduce([g[i] for g in per_rank], op=op, dtype="float32")[0] for i in range(len(params))]


def _close(got: torch.Tensor, want: np.ndarray, what: str, tol: float = 1e-5) -> None:
    err = float(np.abs(got.double().numpy() - want).max()) if want.size else 0.0
    assert err <= tol * max(1.0, float(np.abs(want).max(initial=0.0))), f"{what}: off by {err:.3g}"


@pytest.fixture(scope="module", params=[(2, "hc"), (3, "hc"), (2, "hvd"), (3, "hvd")], ids=lambda p: f"n{p[0]}-{p[1]}")
def ranks(request, tmp_path_factory) -> tuple[int, str, list[dict]]:
    n, mode = request.param
    out = tmp_path_factory.mktemp(f"parity_{n}_{mode}")
    mpirun("horovod_parity.py", n, out, mode, timeout=240)
    return n, mode, load_ranks(out, n)


def test_horovod_op_constants_mean_what_they_mean_in_horovod(ranks) -> None:
    n, mode, saved = ranks
    xs = [rk["x"].double().numpy() for rk in saved]
    average = reference.allreduce(xs, op="Average", dtype="float32")
    total = reference.allreduce(xs, op="Sum", dtype="float32")
    for r, rk in enumerate(saved):
        assert all(rk["constants"].values()), f"rank {r}: hc and hvd constants differ: {rk['constants']}"
        _close(rk["hvd_average"], average[r], f"n={n} {mode} rank {r}: allreduce(op=hvd.Average)")
        _close(rk["int_average"], average[r], f"n={n} {mode} rank {r}: allreduce(op=0)")
        _close(rk["hvd_sum"], total[r], f"n={n} {mode} rank {r}: allreduce(op=hvd.Sum)")


def test_grouped_allreduce_defaults_to_average(ranks) -> None:
    n, mode, saved = ranks
    for i in range(2):
        want = reference.allreduce([rk["ys"][i].double().numpy() for rk in saved], op="Average", dtype="float32")
        for r, rk in enumerate(saved):
            _close(rk["grouped_default"][i], want[r], f"n={n} {mode} rank {r}: grouped_allreduce tensor {i}")


def test_second_wrapper_on_same_model_replaces_the_first(ranks) -> None:
    n, mode, saved = ranks
    params = [t.clone() for t in saved[0]["rewrap"]["start"]]
    for step in range(3):
        grads = _reduced(params, step, n, "Average")
        params = [p - 0.1 * torch.from_numpy(g).float() for p, g in zip(params, grads, strict=True)]
    for r, rk in enumerate(saved):
        for i, (got, want) in enumerate(zip(rk["rewrap"]["final"], params, strict=True)):
            _close(got, want.double().numpy(), f"n={n} {mode} rank {r}: parameter {i} after re-wrapping")
        # the original wrapper still counts passes after a deep copy of the model was wrapped
        assert "computed 2 times" in rk["hook_alive"], f"n={n} {mode} rank {r}: {rk['hook_alive']}"


def test_broadcast_parameters_copies_integer_and_bool_buffers(ranks) -> None:
    n, mode, saved = ranks
    root = saved[0]["broadcast"]
    assert {"0.weight", "1.running_mean", "1.num_batches_tracked", "mask", "counts", "big"} <= set(root)
    assert int(root["1.num_batches_tracked"]) == 1 and int(root["big"][0]) == 2**40
    for r, rk in enumerate(saved[1:], start=1):
        for k, v in root.items():
            got = rk["broadcast"][k]
            assert got.dtype == v.dtype and torch.equal(got, v), f"n={n} {mode} rank {r}: {k} is {got}, root has {v}"


def test_synchronize_clip_skip_synchronize_reduces_once(ranks) -> None:
    n, mode, saved = ranks
    clip = saved[0]["clip"]
    want = _reduced(clip["start"], 0, n, "Sum")
    norm = float(np.sqrt(sum((g**2).sum() for g in want)))
    coef = min(1.0, 0.5 / (norm + 1e-6))
    for r, rk in enumerate(saved):
        c = rk["clip"]
        for i, g in enumerate(want):
            _close(c["reduced"][i], g, f"n={n} {mode} rank {r}: synchronize() gradient {i}")
            _close(c["final"][i], c["start"][i].double().numpy() - 0.05 * coef * g, f"rank {r}: clipped step {i}")
        assert c["norm"] == pytest.approx(norm, rel=1e-5), f"rank {r}: clip saw norm {c['norm']}, want {norm}"
        # step() after synchronize() without skip_synchronize(): Horovod's warning, one reduction only.
        assert SYNC_WARNING in rk["warned"], f"rank {r}: warnings {rk['warned']}"
        nd = rk["no_double"]
        for i, g in enumerate(_reduced(nd["before"], 1, n, "Sum")):
            _close(nd["reduced"][i], g, f"rank {r}: second synchronize() gradient {i}")
            _close(nd["after"][i], nd["before"][i].double().numpy() - 0.05 * g, f"rank {r}: step reduced twice? {i}")
        assert rk["unsynced"].startswith("RuntimeError") and "skip_synchronize" in rk["unsynced"], rk["unsynced"]
        assert rk["unsynced_unchanged"], f"rank {r}: a refused step changed the parameters"


@pytest.mark.parametrize("algorithm", ["adasum", "onebit_adam", "onebit_lamb"])
def test_synchronize_pattern_keeps_ranks_identical_for_every_op(ranks, algorithm) -> None:
    n, mode, saved = ranks
    for r, rk in enumerate(saved[1:], start=1):
        for step, (a, b) in enumerate(zip(saved[0][algorithm]["hashes"], rk[algorithm]["hashes"], strict=True)):
            assert torch.equal(a, b), f"n={n} {mode} {algorithm}: rank {r} differs from rank 0 after step {step}"
        warm0, warm = saved[0][algorithm]["warmup_grads"], rk[algorithm]["warmup_grads"]
        for step, (a, b) in enumerate(zip(warm0, warm, strict=True)):
            assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True)), (
                f"n={n} {mode} {algorithm}: warm-up synchronize() left rank {r}'s gradient unaveraged at step {step}"
            )
    assert all(torch.isfinite(h).all() for h in saved[0][algorithm]["hashes"])
