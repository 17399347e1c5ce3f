"""hc.DistributedOptimizer(op=Average/Sum) reduces gradient buckets while backward runs (overlap=True, the
default), with results bit-identical to reducing the same buckets after backward (overlap=False), equal to the
reference simulation, and an error in one rank's background reduction raised on every rank at step()."""

from __future__ import annotations

import pytest
import torch
from mpi_harness import load_ranks, mpirun

from hvd_compress import reference
from hvd_compress.ops.buckets import plan_buckets

STEPS = 4
BUCKETS = 5  # the worker's model cut into 64-byte buckets: [b3, w3], [b2], [w2], [b1], [w1]
# name -> (op, passes, tolerance against the simulation, an unused parameter registered first); fp16 compression
# rounds each gradient to 16 bits
CONFIGS = {
    "average": ("Average", 1, 1e-5, False),
    "sum_accum_set_to_none": ("Sum", 2, 1e-5, False),
    "predivide_fp16": ("Average", 1, 2e-3, False),
    "unused_parameter": ("Average", 1, 1e-5, True),
}


def _model(unused: bool) -> torch.nn.Module:
    """The worker's model; with ``unused``, a Linear(3, 3) that forward never uses is registered first."""
    torch.manual_seed(1234)
    extra = [torch.nn.Linear(3, 3)] if unused else []
    torch.manual_seed(1234)  # the worker seeds the net again
    net = torch.nn.Sequential(
        torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)
    )
    return torch.nn.ModuleList([*extra, net]) if unused else net


def _simulate(n: int, op: str, passes: int, unused: bool) -> list[list[torch.Tensor]]:
    """The worker's training on one process: every virtual rank's gradient, combined by the reference (a parameter
    without a gradient reduces as zeros, as Horovod's)."""
    model = _model(unused)
    forward = model[-1] if unused else model
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    history = []
    for step in range(STEPS):
        per_rank = []
        for r in range(n):
            model.zero_grad()
            for micro in range(passes):
                g = torch.Generator().manual_seed(100_000 * step + 100 * r + micro)
                x = torch.randn(5, 6, generator=g)
                torch.nn.functional.mse_loss(forward(x), x.sum(dim=1, keepdim=True).sin()).backward()
            per_rank.append([torch.zeros_like(p).double().numpy() if p.grad is None else
                             p.grad.detach().double().numpy().copy() for p in model.parameters()])
        for i, p in enumerate(model.parameters()):
            p.grad = torch.from_numpy(reference.allreduce([g[i] for g in per_rank], op=op, dtype="float32")[0]).float()
        opt.step()
        history.append([p.detach().clone() for p in model.parameters()])
    return history


def test_bucket_plan_follows_reverse_registration_order_with_a_small_first_bucket() -> None:
    items = [("f32", 384), ("f32", 64), ("f32", 1024), ("f32", 64), ("f32", 64), ("f32", 4)]
    assert plan_buckets(items, 64) == [[5, 4], [3], [2], [1], [0]]
    assert plan_buckets(items, 4096, first_bucket_bytes=64) == [[5, 4], [3, 2, 1, 0]]
    # one bucket per dtype key; a key's members stay consecutive
    mixed = [("f32", 8), ("f16", 8), ("f32", 8), ("f16", 8)]
    assert plan_buckets(mixed, 1 << 20) == [[3, 1], [2, 0]]


@pytest.fixture(scope="module", params=[2, 3], ids=lambda n: f"n{n}")
def run(request, tmp_path_factory) -> tuple[int, list[dict]]:
    """One worker run per rank count serves both tests (each mpirun costs seconds)."""
    n = request.param
    out = tmp_path_factory.mktemp(f"overlap_{n}")
    mpirun("overlap.py", n, out, str(STEPS), env={"HVDC_TIMEOUT": "60"})
    return n, load_ranks(out, n)


def test_overlapped_buckets_start_during_backward_and_match_the_step_path_bit_for_bit(run) -> None:
    n, ranks = run
    for name, (op, passes, tol, unused) in CONFIGS.items():
        want = _simulate(n, op, passes, unused)
        # the unused parameter's bucket is the last one and can start only in step()
        buckets, started = (BUCKETS + 1, BUCKETS) if unused else (BUCKETS, BUCKETS)
        for r, rk in enumerate(ranks):
            on, off = rk["results"][(name, True)], rk["results"][(name, False)]
            assert on["overlap"] and not off["overlap"]
            assert on["buckets"] == off["buckets"] == buckets, f"{name} rank {r}: {on['buckets']} buckets"
            # Every bucket was started from a gradient hook: at least one before backward() returned, all by then.
            assert all(d >= 1 for d in on["during"]), f"n={n} {name} rank {r}: started during backward {on['during']}"
            assert on["after"] == [started] * STEPS, f"n={n} {name} rank {r}: started by backward's end {on['after']}"
            assert off["during"] == off["after"] == [0] * STEPS, f"n={n} {name} rank {r}: overlap=False started early"
            # With gradient accumulation, nothing starts before the last pass of a step has made the gradients final.
            want_passes = ([0] * (passes - 1) + [started]) * STEPS
            assert on["per_pass"] == want_passes, f"n={n} {name} rank {r}: started per pass {on['per_pass']}"
            assert on["loss_avg"] == ranks[0]["results"][(name, True)]["loss_avg"], f"{name}: rank {r} loss average"
            for step in range(STEPS):
                for i, (a, b) in enumerate(zip(on["params"][step], off["params"][step], strict=True)):
                    diff = (a - b).abs().max().item()
                    assert torch.equal(a, b), f"n={n} {name} rank {r} step {step} param {i}: overlap off by {diff:.3g}"
                for i, (a, b) in enumerate(zip(on["params"][step], ranks[0]["results"][(name, True)]["params"][step],
                                               strict=True)):
                    assert torch.equal(a, b), f"n={n} {name} step {step} param {i}: rank {r} differs from rank 0"
                for i, (got, exp) in enumerate(zip(on["params"][step], want[step], strict=True)):
                    err = (got - exp).abs().max().item()
                    assert err <= tol, f"n={n} {name} rank {r} step {step} param {i}: {err:.3g} from the simulation"


def test_error_in_one_ranks_background_reduction_raises_on_every_rank_at_step(run) -> None:
    n, ranks = run
    for r, rk in enumerate(ranks):
        assert "injected failure in rank 1's bucket 1" in rk["error"], f"n={n} rank {r}: step() gave {rk['error']}"
        assert rk["error"].startswith("RejectedInputError"), f"n={n} rank {r}: {rk['error']}"
        assert rk["error_seconds"] < 20, f"n={n} rank {r}: the error took {rk['error_seconds']:.1f} s (a wait?)"
        assert rk["unchanged_after_error"], f"n={n} rank {r}: the failed step changed the parameters"
        for i, (a, b) in enumerate(zip(rk["after_recovery"], ranks[0]["after_recovery"], strict=True)):
            assert torch.equal(a, b), f"n={n}: after the error, rank {r} param {i} differs from rank 0"
