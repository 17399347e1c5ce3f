"""1-bit Adam's warm-up is the wrapped optimizer's own step on the averaged gradient (paper 003, Algorithm 1 line 2):
op=OneBitAdam around torch.optim.Adam/AdamW gives, bit for bit, the parameters of the same optimizer behind
op=Average at every warm-up step. 1-bit LAMB's warm-up orders LAMB's operations its own way
(docs/algorithms/onebit-lamb.md, "Warm-up"): after its first step it is within 8 float32 ulps of hc.Lamb's behind
op=Average (later steps are not compared: the gradient of a bias that feeds BatchNorm is rounding noise, so a
last-bit difference in the weights changes it wholly). At 2 and 3 ranks, one launch each, every case."""

from __future__ import annotations

import numpy as np
import pytest
from mpi_harness import load_ranks, mpirun

STEPS = 12
CASES = ["Adam", "Adam_l2", "AdamW"]
LAMB_CASES = ["Lamb", "Lamb_wd_uncorrected"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory):
    done: dict[int, list[dict]] = {}

    def get(n: int) -> list[dict]:
        if n not in done:
            out = tmp_path_factory.mktemp(f"onebit_warmup{n}")
            mpirun("onebit_warmup.py", n, out, str(STEPS), timeout=300)
            done[n] = load_ranks(out, n)
        return done[n]

    return get


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("case", CASES)
def test_warmup_is_the_wrapped_optimizers_own_step_bit_for_bit(runs, n: int, case: str) -> None:
    for r, rk in enumerate(runs(n)):
        dense, warmup = rk[case]["dense"], rk[case]["warmup"]
        assert len(dense) == len(warmup) == STEPS
        for t, (a, b) in enumerate(zip(dense, warmup, strict=True)):
            differ = (a != b).nonzero().flatten()
            assert differ.numel() == 0, (
                f"{case} n={n} rank {r} step {t + 1}: {differ.numel()} of {a.numel()} elements differ from the "
                f"wrapped optimizer's own step, by up to {(a - b).abs().max().item():.3g}")


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("case", LAMB_CASES)
def test_onebit_lamb_warmup_is_lambs_step_up_to_rounding(runs, n: int, case: str) -> None:
    for r, rk in enumerate(runs(n)):
        a, b = rk[case]["dense"][0].numpy(), rk[case]["warmup"][0].numpy()
        ulps = np.abs(a - b) / np.spacing(np.abs(a))
        assert ulps.max() <= 8, f"{case} n={n} rank {r} step 1: {ulps.max():.0f} ulps off hc.Lamb's own step"
