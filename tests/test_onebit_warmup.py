"""1-bit Adam's and 1-bit LAMB's warm-up is the wrapped optimizer's own step on the averaged gradient (paper 003 and
001, Algorithm 1 line 2): op=OneBitAdam around torch.optim.Adam/AdamW and op=OneBitLamb around hc.Lamb give, bit for
bit, the parameters of the same optimizer behind op=Average, at every warm-up step, at 2 and 3 ranks (one launch
each, every case)."""

from __future__ import annotations

import pytest
from mpi_harness import load_ranks, mpirun

STEPS = 12
CASES = ["Adam", "Adam_l2", "AdamW", "Lamb", "Lamb_wd_uncorrected"]


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
