"""hc.DistributedOptimizer with Average/Sum: identical parameters on every rank, equal to a simulation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from mpi_harness import load_ranks, mpirun

from hvd_compress import reference


def _simulate(init: list[torch.Tensor], n: int, op: str, steps: int, passes: int) -> list[torch.Tensor]:
    """The same training on one process: each virtual rank's gradient, combined by the reference."""
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    with torch.no_grad():
        for p, v in zip(model.parameters(), init, strict=True):
            p.copy_(v)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    for step in range(steps):
        per_rank = []
        for r in range(n):
            model.zero_grad()
            for micro in range(passes):
                g = torch.Generator().manual_seed(100_000 * step + 100 * r + micro)
                x = torch.randn(5, 6, generator=g)
                y = x.sum(dim=1, keepdim=True).sin()
                torch.nn.functional.mse_loss(model(x), y).backward()
            per_rank.append([p.grad.detach().double().numpy().copy() for p in model.parameters()])
        for i, p in enumerate(model.parameters()):
            reduced = reference.allreduce([g[i] for g in per_rank], op=op, dtype="float32")[0]
            p.grad = torch.from_numpy(reduced).float()
        opt.step()
        sched.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize(("n", "op", "passes"), [(2, "Average", 1), (3, "Average", 2), (4, "Sum", 1)])
def test_distributed_optimizer_matches_simulation_and_keeps_ranks_identical(n, op, passes, out_dir) -> None:
    steps = 8
    mpirun("optimizer.py", n, out_dir, op, str(steps), str(passes))
    ranks = load_ranks(out_dir, n)
    for r in range(1, n):
        for i, (a, b) in enumerate(zip(ranks[0]["init"], ranks[r]["init"], strict=True)):
            assert torch.equal(a, b), f"broadcast_parameters: rank {r} tensor {i} differs from rank 0"
        for step, (h0, hr) in enumerate(zip(ranks[0]["hashes"], ranks[r]["hashes"], strict=True)):
            assert h0 == hr, f"n={n}: rank {r} parameters differ from rank 0 after step {step}"
    want = _simulate(ranks[0]["init"], n, op, steps, passes)
    for i, (got, exp) in enumerate(zip(ranks[0]["final"], want, strict=True)):
        err = (got - exp).abs().max().item()
        assert err < 1e-5, f"n={n} {op}: parameter {i} is {err:.3g} away from the simulation"
    for r, rk in enumerate(ranks):
        assert rk["lr"] == pytest.approx(0.05 * 0.5 ** (steps // 3)), f"rank {r}: LR scheduler not applied"
        numel = sum(t.numel() for t in rk["final"])
        data = steps * int(2 * (n - 1) / n * numel * 4)
        assert rk["stats"]["bytes_sent"] >= data, f"rank {r}: comm_stats {rk['stats']} < {data}"
        assert "backward_passes_per_step" in rk["too_many"], f"rank {r}: {rk['too_many']}"
        assert rk["state_keys"] == ["param_groups", "state"]
        assert np.isfinite(rk["losses"]).all()
