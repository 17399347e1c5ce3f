"""Horovod's API on hc, each item against the NumPy reference at 2 and 3 ranks (hc.init() and hvd.init())."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from mpi_harness import load_ranks, mpirun

from hvd_compress import reference


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().numpy()


def _close(got: torch.Tensor, want: np.ndarray, what: str, tol: float = 1e-5) -> None:
    err = float(np.abs(_np(got) - want).max()) if want.size else 0.0
    assert err <= tol * max(1.0, float(np.abs(want).max())), f"{what}: off by {err:.3g}"


def _grads(params: list[torch.Tensor], step: int, rank: int, micro: int) -> list[np.ndarray]:
    model = torch.nn.Linear(6, 1)
    with torch.no_grad():
        for p, v in zip(model.parameters(), params, strict=True):
            p.copy_(v)
    g = torch.Generator().manual_seed(1000 * step + 10 * rank + micro)
    inp = torch.randn(4, 6, generator=g)
    torch.nn.functional.mse_loss(model(inp), inp.sum(1, keepdim=True)).backward()
    return [_np(p.grad) for p in model.parameters()]


@pytest.mark.parametrize(("n", "mode"), [(2, "hc"), (3, "hvd")])
def test_horovod_api_pieces_match_the_reference(n: int, mode: str, out_dir) -> None:
    mpirun("horovod_api.py", n, out_dir, mode, timeout=240)
    ranks = load_ranks(out_dir, n)
    xs = [_np(rk["x"]) for rk in ranks]
    total = reference.allreduce(xs, op="Sum", dtype="float32")
    average = reference.allreduce(xs, op="Average", dtype="float32")
    for r, rk in enumerate(ranks):
        _close(rk["scaled_sum"], 0.5 * total[r], f"rank {r}: prescale 2, postscale 1/4")
        _close(rk["average_false"], total[r], f"rank {r}: average=False")
        assert rk["both"].startswith("ValueError") and "average" in rk["both"], rk["both"]
        before, y = rk["broadcast"]
        assert torch.equal(before, rk["x"]) and torch.equal(y, ranks[n - 1]["x"]), f"rank {r}: broadcast"
        a = rk["async"]
        _close(a["sum"], total[r], f"rank {r}: allreduce_async Sum")
        assert a["inplace"][0], f"rank {r}: allreduce_async_ did not return the tensor it reduced"
        _close(a["inplace"][1], average[r], f"rank {r}: allreduce_async_")
        for i, key in enumerate(("a", "b")):
            want = reference.allreduce([_np(q["async"][key]) for q in ranks], op="Average",
                                       dtype=("float32", "float64")[i])
            _close(a["grouped"][i], want[r], f"rank {r}: grouped_allreduce_async tensor {i}")
        assert torch.equal(a["bcast"], ranks[0]["x"]) and a["polled"], f"rank {r}: broadcast_async / poll"
        assert rk["async_error"].startswith("MismatchError") and "shape" in rk["async_error"], rk["async_error"]
        assert rk["after_error"].tolist() == [float(sum(range(n)))] * 2, f"rank {r}: {rk['after_error']}"
        # Two backward passes per step: the step uses the sum of both micro-batches' gradients, averaged.
        start = rk["passes"]["start"]
        per_rank = [[a + b for a, b in zip(_grads(start, 0, q, 0), _grads(start, 0, q, 1), strict=True)]
                    for q in range(n)]
        for i, p in enumerate(start):
            g = reference.allreduce([pr[i] for pr in per_rank], op="Average", dtype="float32")[0]
            _close(rk["passes"]["final"][i], _np(p) - 0.1 * g, f"rank {r}: parameter {i} with 2 passes per step")
        assert "computed 3 times" in rk["third_pass"], rk["third_pass"]
        assert rk["bad_passes"].startswith("ValueError"), rk["bad_passes"]
        for i, (p, q) in enumerate(zip(rk["plain"], rk["predivide"], strict=True)):
            _close(q, _np(p), f"rank {r}: gradient_predivide_factor changed parameter {i}", tol=1e-6)
        assert rk["predivide_sum"].startswith("ValueError") and "op=Average" in rk["predivide_sum"]
