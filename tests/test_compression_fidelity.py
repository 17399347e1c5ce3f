"""Fidelity of compression= (issue 9, item 7): top-k 1% with Deep Gradient Compression's momentum correction
(``hc.Compression.topk(0.01, momentum=0.9, momentum_masking=False)`` under SGD(lr=0.1, momentum=0)) reaches a mean
final held-out loss over seeds 1, 2, 3 within 2% of dense SGD(lr=0.1, momentum=0.9) at 4 ranks, on a ReLU MLP with
real data (scikit-learn's digits), with identical parameters on every rank. Same model, data order and cosine decay
for all; see the worker. Plain top-k 1% (error feedback, the wrapped SGD's momentum 0.9) is printed as information.

Measured (2026-11-25, 4 ranks on 2 cores, 800 steps), final held-out loss for seeds 1 / 2 / 3 and mean:
  dense SGD momentum 0.9              0.0754 / 0.0608 / 0.0578, mean 0.0647
  top-k 1%, SGD momentum 0.9          0.0778 / 0.0665 / 0.0694, mean 0.0712 (+10.2%)
  DGC top-k 1%, masking (paper rule)  0.0815 / 0.0819 / 0.0819, mean 0.0818 (+26.4%)
  DGC top-k 1%, no momentum masking   0.0684 / 0.0585 / 0.0569, mean 0.0613 (-5.2%)
  DGC with masking and a sparsity warm-up (25%, 6.25%, 1.5625% for 100 steps each, then 1%; a Python
  prototype around plain top-k's state, not kept): 0.1016 on seed 1.
All compressed runs sent 7,032 bytes per step against dense SGD's 157,500.

Why masking loses here (the likely mechanism, not traced element by element): momentum factor masking zeroes
the velocity u of every element this rank sends. The largest gradients are sent nearly every step (k = 261 of
the 26,122 parameters), so for them u is reset each step and the update is plain SGD without momentum (a 10x
smaller effective step than momentum 0.9 gives a steady gradient); the run under-trains (every seed ends near
0.082). A warm-up sends more elements early and so masks more. Without masking, every gradient's whole momentum
tail still reaches the accumulator, as in dense momentum SGD, only later.
(Earlier history: plain top-k measured +0.3% on one machine and +2.7% on another for seed 1 alone, +16% to +52% at
1000-1200 steps, +55% / +26% / +10% per seed at 2000 steps: the error buffer releases stale mass that the wrapped
optimizer's momentum then amplifies.)
"""

from __future__ import annotations

import math
import statistics

from mpi_harness import load_ranks, mpirun

N, STEPS, SEEDS = 4, 800, (1, 2, 3)
RUNS = ("dense", "topk:0.01", "dgc-nomask:0.01")
DGC = "dgc-nomask:0.01"


def _per_seed(res: dict, run: str) -> str:
    return ", ".join(f"{res[f'{run}@{s}']['test_loss']:.4f}/{res[f'dense@{s}']['test_loss']:.4f}" for s in SEEDS)


def test_topk_one_percent_with_dgc_momentum_correction_within_two_percent_of_dense_momentum_sgd(out_dir) -> None:
    seeds = ",".join(map(str, SEEDS))
    mpirun("compression_fidelity.py", N, out_dir, str(STEPS), ",".join(RUNS), "0.1", "0.9", seeds, timeout=1350)
    ranks = load_ranks(out_dir, N)
    for key in (f"{run}@{seed}" for run in RUNS for seed in SEEDS):
        assert len({rk[key]["hash"] for rk in ranks}) == 1, f"{key}: parameters differ across {N} ranks"
    res = ranks[0]
    for seed in SEEDS:
        dense = res[f"dense@{seed}"]
        assert math.isfinite(dense["test_loss"]), f"dense SGD did not train (seed {seed})"
        for run in RUNS[1:]:
            ratio = res[f"{run}@{seed}"]["bytes_per_step"] / dense["bytes_per_step"]
            assert ratio < 0.06, f"{run} sent {ratio:.3f} of dense SGD's bytes per step (seed {seed})"
    mean = {run: statistics.mean(res[f"{run}@{s}"]["test_loss"] for s in SEEDS) for run in RUNS}
    rel = {run: mean[run] / mean["dense"] - 1 for run in RUNS}
    for run in RUNS[1:]:  # plain top-k is information only (module docstring)
        print(f"{run} vs dense SGD per seed: {_per_seed(res, run)}; means {mean[run]:.4f} vs {mean['dense']:.4f} "
              f"({100 * rel[run]:+.2f}%)")
    assert rel[DGC] <= 0.02, (
        f"top-k 1% with DGC momentum correction (no masking): mean final held-out loss over seeds {seeds} is "
        f"{mean[DGC]:.4f}, {100 * rel[DGC]:+.2f}% off dense SGD's {mean['dense']:.4f} (per seed DGC/dense: "
        f"{_per_seed(res, DGC)})"
    )
