"""op=Average in the TF faces (hck.DistributedOptimizer under model.fit, Keras 3 and tf_keras;
hc.DistributedGradientTape in a tf.function): gradient buckets start while backward still runs (overlap=True, the
default), with parameters bit-identical to reducing the same buckets after backward (overlap=False), identical on
every rank, and equal to SGD on the gradient averaged over every rank's batch (simulated without communication); bad
bucket options raise on every rank."""

from __future__ import annotations

import numpy as np
import pytest
from mpi_harness import load_pickled_ranks, mpirun

STEPS, BUCKETS = 3, 2  # the worker's model in ~1 KB buckets: [Dense3, Dense2], [Dense1]


@pytest.mark.parametrize(("n", "legacy"), [(2, False), (3, False), (2, True)], ids=["2", "3", "2-tf_keras"])
def test_tf_buckets_start_before_backward_ends_with_identical_results(n: int, legacy: bool, out_dir) -> None:
    mpirun("tf_overlap.py", n, out_dir, timeout=300, env={"TF_USE_LEGACY_KERAS": "1"} if legacy else None)
    ranks = load_pickled_ranks(out_dir, n)
    for r, rk in enumerate(ranks):
        bad = rk["bad"]
        assert bad["bucket_mb=0"].startswith("ValueError: bucket_mb must be a number > 0"), (r, bad)
        assert bad["overlap='yes'"].startswith("TypeError: overlap must be True or False"), (r, bad)
        assert bad["freeze_step"].startswith("TypeError: op=Average takes bucket_mb, overlap"), (r, bad)
        assert bad["tape bucket_mb=-1"].startswith("ValueError: bucket_mb must be a number > 0"), (r, bad)
        assert bad["tape overlap='yes'"].startswith("TypeError: overlap must be True or False"), (r, bad)
    for face in ("fit",) if legacy else ("fit", "tape"):
        for overlap in (True, False):
            runs = [rk[f"{face}-{overlap}"] for rk in ranks]
            for r, run in enumerate(runs):
                where = f"{face} overlap={overlap} rank {r} of {n}"
                assert run["launched"] == STEPS * BUCKETS, where
                # The first layer's gradient (the last of backward, 0.3 s late) saw this step's first bucket
                # started with overlap, and none of them without.
                for s, seen in enumerate(run["seen"]):
                    if overlap:
                        assert BUCKETS * s < seen, f"{where}, step {s}: no bucket started during backward ({seen})"
                    else:
                        assert seen == BUCKETS * s, f"{where}, step {s}: a bucket started before backward ended"
                assert len(run["seen"]) == STEPS, where
                for s in range(STEPS):
                    for got, want, ref in zip(run["params"][s], runs[0]["params"][s], ranks[r]["simulated"][s],
                                              strict=True):
                        assert np.array_equal(got, want), f"{where}, step {s}: differs from rank 0"
                        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5, err_msg=f"{where}, step {s}")
        for s in range(STEPS):
            for a, b in zip(ranks[0][f"{face}-True"]["params"][s], ranks[0][f"{face}-False"]["params"][s],
                            strict=True):
                assert np.array_equal(a, b), f"{face}, step {s}: overlap=True and False differ"
    # Every train step in one tf.function call (steps_per_execution): the same parameters as the simulation.
    for r, rk in enumerate(ranks):
        for got, want in zip(rk["fit-steps_per_execution"], rk["simulated"][-1], strict=True):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-5, err_msg=f"steps_per_execution, rank {r} of {n}")
