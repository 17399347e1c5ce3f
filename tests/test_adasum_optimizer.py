"""hc.DistributedOptimizer(op=hc.Adasum): local step, then Adasum of the parameter deltas (paper 002, Sec. 4.1)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from mpi_harness import Cases

from hvd_compress import reference

OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1),
}


MATCH = [(2, "sgd"), (3, "adam"), (4, "adamw"), (3, "accum")]
HALF = ["bfloat16", "float16"]
SCALER = [2, 3]
# Every case at one rank count in one launch.
CASES = {2: [("sgd", "6"), *[(dtype, "10") for dtype in HALF], ("scaler", "6")],
         3: [("adam", "6"), ("accum", "6"), ("train", "50"), ("scaler", "6")],
         4: [("adamw", "6")]}


@pytest.fixture(scope="module")
def launched(tmp_path_factory) -> Cases:
    return Cases("adasum_optimizer.py", CASES, tmp_path_factory.mktemp("adasum_optimizer"), timeout_per_case=60)


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def _simulate(init, n: int, name: str, steps: int, passes: int) -> list[list[torch.Tensor]]:
    """n virtual ranks, each with its own optimizer state, on one shared set of parameters."""
    shared = [t.clone() for t in init]
    models = [_model() for _ in range(n)]
    opts = [OPTIMIZERS[name](m.parameters()) for m in models]
    scheds = [torch.optim.lr_scheduler.StepLR(o, step_size=4, gamma=0.5) for o in opts]
    history = []
    for step in range(steps):
        deltas = []
        for r, (m, o) in enumerate(zip(models, opts, strict=True)):
            with torch.no_grad():
                for p, s in zip(m.parameters(), shared, strict=True):
                    p.copy_(s)
            o.zero_grad()
            for micro in range(passes):
                g = torch.Generator().manual_seed(100_000 * step + 100 * r + micro)
                x = torch.randn(5, 6, generator=g)
                torch.nn.functional.mse_loss(m(x), x.sum(dim=1, keepdim=True).sin()).backward()
            o.step()
            deltas.append([(p.detach() - s).double().numpy() for p, s in zip(m.parameters(), shared, strict=True)])
        for i in range(len(shared)):
            combined = reference.adasum([d[i].reshape(-1) for d in deltas], dtype="float32")[0]
            shared[i] = shared[i] + torch.from_numpy(combined).float().view_as(shared[i])
        for s in scheds:
            s.step()
        history.append([t.clone() for t in shared])
    return history


@pytest.mark.parametrize(("n", "name"), MATCH)
def test_adasum_optimizer_matches_simulation_and_ranks_stay_identical(n, name, launched) -> None:
    steps = 6
    ranks = launched.ranks(n, (name, str(steps)))
    for r in range(1, n):
        for step, (h0, hr) in enumerate(zip(ranks[0]["hashes"], ranks[r]["hashes"], strict=True)):
            assert h0 == hr, f"n={n} {name}: rank {r} parameters differ from rank 0 after step {step}"
    passes = 2 if name == "accum" else 1
    want = _simulate(ranks[0]["init"], n, "sgd" if name == "accum" else name, steps, passes)
    for step in range(steps):
        for i, (got, exp) in enumerate(zip(ranks[0]["params"][step], want[step], strict=True)):
            err = (got - exp).abs().max().item()
            assert err < 2e-5, f"n={n} {name}: step {step} parameter {i} is {err:.3g} from the simulation"
    for r, rk in enumerate(ranks):
        assert rk["lr"] == pytest.approx({"sgd": 0.05, "accum": 0.05}.get(name, 0.01) * 0.5 ** (steps // 4))
        assert rk["stats"]["bytes_sent"] > 0, f"rank {r}: {rk['stats']}"
        assert rk["state_roundtrip"], f"rank {r}: state_dict() did not survive load_state_dict()"
        # One bucket per parameter: every bucket is launched from a hook, during backward.
        assert rk["buckets"] == 4 and rk["launched"] == [rk["buckets"]] * steps, f"rank {r}: {rk['launched']}"


def test_adasum_optimizer_keeps_ranks_identical_for_50_steps_and_lowers_the_loss(launched) -> None:
    ranks = launched.ranks(3, ("train", "50"))
    assert len({rk["hash"] for rk in ranks}) == 1, "ranks hold different parameters after 50 steps"
    losses = ranks[0]["losses"]
    assert np.mean(losses[-5:]) < 0.9 * losses[0], f"loss went {losses[0]:.4f} -> {np.mean(losses[-5:]):.4f}"


@pytest.mark.parametrize("dtype", HALF)
def test_adasum_optimizer_with_half_precision_parameters(dtype, launched) -> None:
    ranks = launched.ranks(2, (dtype, "10"))
    assert ranks[0]["dtypes"] == [f"torch.{dtype}"] * 4
    assert ranks[0]["hashes"] == ranks[1]["hashes"], f"{dtype}: ranks diverged"
    assert len(set(ranks[0]["hashes"])) == 10, f"{dtype}: parameters did not move every step"


@pytest.mark.parametrize("n", SCALER)
def test_grad_scaler_overflow_on_one_rank_skips_the_step_on_every_rank(n, launched) -> None:
    ranks = launched.ranks(n, ("scaler", "6"))
    for r, rk in enumerate(ranks):
        assert rk["hashes"] == ranks[0]["hashes"], f"rank {r} diverged from rank 0"
        assert rk["scales"] == ranks[0]["scales"], f"rank {r} scales {rk['scales']} vs {ranks[0]['scales']}"
        assert rk["skipped"] == [False, False, False, True, False, False], f"rank {r}: skipped {rk['skipped']}"
        assert rk["scales"][3] == rk["scales"][2] / 2, f"rank {r}: scale not backed off after the overflow"
