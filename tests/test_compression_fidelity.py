"""Fidelity of compression= (issue 29, item 3): top-k 1% with all of Deep Gradient Compression that this task
needs (``hc.Compression.topk(0.01, momentum=0.9, momentum_masking=False, warmup_steps=WARMUP,
warmup_stages=WARMUP)``: momentum correction without factor masking, and the sparsity warm-up ramped step by
step) under SGD(lr=0.1, momentum=0) reaches a mean held-out loss over seeds 1, 2, 3 within 2% of dense
SGD(lr=0.1, momentum=0.9) at every checkpoint (every 200 steps) of a 1,200-step run at 4 ranks, on a ReLU MLP
with real data (scikit-learn's digits), with identical parameters on every rank; after the warm-up it sends
under 6% of dense SGD's bytes per step. Same model, data order and cosine decay for both; see the worker. The
measured figures, the variants tried (masking, clipping, staged ramps) and why masking under-trains are in
docs/algorithms/compression.md.
"""

from __future__ import annotations

import math
import statistics

from mpi_harness import load_ranks, mpirun

N, STEPS, EVERY, SEEDS = 4, 1200, 200, (1, 2, 3)
WARMUP = 700
DGC = f"dgc-nomask:0.01:warmup_steps={WARMUP}:warmup_stages={WARMUP}"
RUNS = ("dense", DGC)


def test_topk_one_percent_with_dgc_within_two_percent_of_dense_momentum_sgd_at_every_checkpoint(out_dir) -> None:
    seeds = ",".join(map(str, SEEDS))
    mpirun("compression_fidelity.py", N, out_dir, str(STEPS), ",".join(RUNS), "0.1", "0.9", seeds, str(EVERY),
           timeout=1350)
    ranks = load_ranks(out_dir, N)
    for key in (f"{run}@{seed}" for run in RUNS for seed in SEEDS):
        assert len({rk[key]["hash"] for rk in ranks}) == 1, f"{key}: parameters differ across {N} ranks"
    res = ranks[0]
    for seed in SEEDS:
        dense, dgc = res[f"dense@{seed}"], res[f"{DGC}@{seed}"]
        assert math.isfinite(dense["test_loss"]), f"dense SGD did not train (seed {seed})"
        after = [s for s in dgc["window_bytes_per_step"] if s - EVERY >= WARMUP]
        assert after, "no checkpoint window after the warm-up"
        for s in after:
            ratio = dgc["window_bytes_per_step"][s] / dense["window_bytes_per_step"][s]
            assert ratio < 0.06, f"DGC sent {ratio:.3f} of dense SGD's bytes per step in the steps up to {s}"
        print(f"seed {seed}: DGC sent {dgc['bytes_per_step'] / dense['bytes_per_step']:.3f} of dense SGD's bytes "
              "over the run (warm-up included)")
    bad = []
    for step in range(EVERY, STEPS + 1, EVERY):
        mean = {run: statistics.mean(res[f"{run}@{s}"]["checkpoints"][step] for s in SEEDS) for run in RUNS}
        per_seed = ", ".join(f"{res[f'{DGC}@{s}']['checkpoints'][step]:.4f}/"
                             f"{res[f'dense@{s}']['checkpoints'][step]:.4f}" for s in SEEDS)
        rel = mean[DGC] / mean["dense"] - 1
        line = f"step {step}: DGC {mean[DGC]:.4f} vs dense {mean['dense']:.4f} ({100 * rel:+.2f}%; per seed {per_seed})"
        print(line)
        if rel > 0.02:
            bad.append(line)
    assert not bad, "top-k 1% with DGC is more than 2% off dense SGD's mean held-out loss at:\n" + "\n".join(bad)
