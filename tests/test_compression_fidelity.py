"""Fidelity of compression= (issue 29, item 3): top-k 1% with all of Deep Gradient Compression that this task
needs (``hc.Compression.topk(0.01, momentum=0.9, momentum_masking=False, warmup_steps=WARMUP,
warmup_stages=WARMUP)``: momentum correction without factor masking, and the sparsity warm-up ramped step by
step) under SGD(lr=0.1, momentum=0) against dense SGD(lr=0.1, momentum=0.9): mean held-out loss over seeds 1-6 at
every checkpoint (every 200 steps) of a 1,200-step run at 4 ranks, on a ReLU MLP with real data (scikit-learn's
digits), identical parameters on every rank, under 6% of dense SGD's bytes per step after the warm-up. Within 2%
at every checkpoint after the warm-up is asserted; within 2% at every checkpoint, the issue's target, is an
expected failure: in the middle of the warm-up (step 400) top-k trails by about 7% over six seeds, with torch's
AVX2 and AVX-512 kernels alike (seeds 1-3 alone met it with the AVX2 ones). One launch serves the three tests.
Same model, data order and cosine decay for both; see the worker. The measured figures and the variants tried
are in docs/algorithms/compression.md.
"""

from __future__ import annotations

import math
import statistics

import pytest
from mpi_harness import load_ranks, mpirun

N, STEPS, EVERY, SEEDS = 4, 1200, 200, (1, 2, 3, 4, 5, 6)
WARMUP = 700
DGC = f"dgc-nomask:0.01:warmup_steps={WARMUP}:warmup_stages={WARMUP}"
RUNS = ("dense", DGC)


@pytest.fixture(scope="module")
def rank0(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Rank 0's results of one launch, after checking that every rank holds the same parameters."""
    out_dir = tmp_path_factory.mktemp("compression_fidelity")
    mpirun("compression_fidelity.py", N, out_dir, str(STEPS), ",".join(RUNS), "0.1", "0.9",
           ",".join(map(str, SEEDS)), str(EVERY), timeout=1350)
    ranks = load_ranks(out_dir, N)
    for key in (f"{run}@{seed}" for run in RUNS for seed in SEEDS):
        assert len({rk[key]["hash"] for rk in ranks}) == 1, f"{key}: parameters differ across {N} ranks"
    return ranks[0]


def _over_two_percent(res: dict, steps: range) -> list[str]:
    """The checkpoints among ``steps`` where top-k's mean held-out loss is more than 2% above dense SGD's."""
    bad = []
    for step in steps:
        mean = {run: statistics.mean(res[f"{run}@{s}"]["checkpoints"][step] for s in SEEDS) for run in RUNS}
        per_seed = ", ".join(f"{res[f'{DGC}@{s}']['checkpoints'][step]:.4f}/"
                             f"{res[f'dense@{s}']['checkpoints'][step]:.4f}" for s in SEEDS)
        rel = mean[DGC] / mean["dense"] - 1
        line = f"step {step}: DGC {mean[DGC]:.4f} vs dense {mean['dense']:.4f} ({100 * rel:+.2f}%; per seed {per_seed})"
        print(line)
        if rel > 0.02:
            bad.append(line)
    return bad


def test_topk_one_percent_with_dgc_sends_under_six_percent_of_dense_after_its_warm_up(rank0) -> None:
    for seed in SEEDS:
        dense, dgc = rank0[f"dense@{seed}"], rank0[f"{DGC}@{seed}"]
        assert math.isfinite(dense["test_loss"]), f"dense SGD did not train (seed {seed})"
        after = [s for s in dgc["window_bytes_per_step"] if s - EVERY >= WARMUP]
        assert after, "no checkpoint window after the warm-up"
        for s in after:
            ratio = dgc["window_bytes_per_step"][s] / dense["window_bytes_per_step"][s]
            assert ratio < 0.06, f"DGC sent {ratio:.3f} of dense SGD's bytes per step in the steps up to {s}"
        print(f"seed {seed}: DGC sent {dgc['bytes_per_step'] / dense['bytes_per_step']:.3f} of dense SGD's bytes "
              "over the run (warm-up included)")


def test_topk_one_percent_with_dgc_within_two_percent_of_dense_after_its_warm_up(rank0) -> None:
    bad = _over_two_percent(rank0, range(EVERY * (WARMUP // EVERY + 1), STEPS + 1, EVERY))
    assert not bad, "top-k 1% with DGC is more than 2% off dense SGD's mean held-out loss at:\n" + "\n".join(bad)


@pytest.mark.xfail(strict=True, reason="open: top-k 1% with DGC trails dense SGD by about 7% at step 400, in the "
                   "middle of its sparsity warm-up, over seeds 1-6 (docs/algorithms/compression.md)")
def test_topk_one_percent_with_dgc_within_two_percent_of_dense_momentum_sgd_at_every_checkpoint(rank0) -> None:
    bad = _over_two_percent(rank0, range(EVERY, STEPS + 1, EVERY))
    assert not bad, "top-k 1% with DGC is more than 2% off dense SGD's mean held-out loss at:\n" + "\n".join(bad)
