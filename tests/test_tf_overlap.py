"""op=Average in the TF faces (hck.DistributedOptimizer under model.fit, Keras 3 and tf_keras;
hc.DistributedGradientTape in a tf.function): gradient buckets start while backward still runs (overlap=True, the
default), with parameters bit-identical to reducing the same buckets after backward (overlap=False), identical on
every rank, and equal to SGD on the gradient averaged over every rank's batch (simulated without communication); bad
bucket options raise on every rank. The same for the buckets of op=SLAMB, Birder, OneBitAdam and OneBitLamb (model.fit):
started during backward, bit-identical with overlap off, with steps_per_execution and when resumed from a checkpoint,
SLAMB also with one bucket; the per-bucket state of Birder and the 1-bit ops records the cut, and a state of another
cut is refused on every rank."""

from __future__ import annotations

import numpy as np
import pytest
from mpi_harness import load_pickled_ranks, mpirun

STEPS, BUCKETS = 3, 2  # the worker's model in ~1 KB buckets: [Dense3, Dense2], [Dense1]
ALGORITHMS = ("SLAMB", "Birder", "OneBitAdam", "OneBitLamb")


# Keras 3 at 3 ranks (an odd count, where averaging is not a power-of-two split) and tf_keras at 2: the worker's
# checks do not depend on the rank count otherwise, so a third launch (Keras 3 at 2) would only repeat them. The
# fast tier's tf_keras run takes two of the algorithm ops (Birder, per-bucket state and its cut; 1-bit Adam, the
# 1-bit ops' warm-up then compressed steps), the long tier's every one.
@pytest.mark.parametrize(("n", "legacy", "ops"), [(3, False, ALGORITHMS), (2, True, ("Birder", "OneBitAdam")),
                                                  pytest.param(2, True, ALGORITHMS, marks=pytest.mark.long)],
                         ids=["3", "2-tf_keras", "2-tf_keras-every-op"])
def test_tf_buckets_start_before_backward_ends_with_identical_results(n: int, legacy: bool, ops: tuple[str, ...],
                                                                      out_dir) -> None:
    env = {"TF_OVERLAP_OPS": ",".join(ops), **({"TF_USE_LEGACY_KERAS": "1"} if legacy else {})}
    mpirun("tf_overlap.py", n, out_dir, timeout=300, env=env)
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
    for op in ops:
        for r, rk in enumerate(ranks):
            where = f"{op} rank {r} of {n}"
            bad = rk["bad"]
            assert bad[f"{op} bucket_mb=0"].startswith("ValueError: bucket_mb must be a number > 0"), (where, bad)
            assert bad[f"{op} overlap=1"].startswith("TypeError: overlap must be True or False"), (where, bad)
            on, off, one = rk[f"{op}-True"], rk[f"{op}-False"], rk[f"{op}-one-bucket"]
            assert (on["buckets"], off["buckets"], one["buckets"]) == (BUCKETS, BUCKETS, 1), where
            # The first bucket (Dense3, Dense2) started before the first layer's gradient was done, with overlap only.
            assert on["seen"] == [1] * STEPS and off["seen"] == [0] * STEPS and one["seen"] == [0] * STEPS, where
            assert rk[f"{op}-steps_per_execution"]["seen"] == [1] * STEPS, where
            assert rk[f"{op}-resumed"], f"{where}: a run resumed from a checkpoint differs from one never stopped"
            for s in range(STEPS):
                for a, b in zip(on["params"][s], off["params"][s], strict=True):
                    assert np.array_equal(a, b), f"{where}, step {s}: overlap=True and False differ"
            for k, v in on["state"].items():
                assert np.array_equal(v, off["state"][k]), f"{where}: state {k} differs with overlap off"
            for a, b, c in zip(on["params"][-1], ranks[0][f"{op}-True"]["params"][-1],
                               rk[f"{op}-steps_per_execution"]["params"][0], strict=True):
                assert np.array_equal(a, b), f"{where}: the parameters after the last step differ from rank 0"
                assert np.array_equal(a, c), f"{where}: steps_per_execution differs"
            if op == "SLAMB":  # its state is over all elements: one bucket reduces the same masked averages
                for s in range(STEPS):
                    for a, c in zip(on["params"][s], one["params"][s], strict=True):
                        assert np.array_equal(a, c), f"{where}, step {s}: one bucket differs"
            else:  # Birder's and the 1-bit ops' state is per bucket, and records the cut
                assert on["state"]["buckets"].tolist() == [12 * 32 + 32, 32 * 32 + 32 + 32 * 3 + 3], where
                assert "buckets" not in one["state"], where
    for r, rk in enumerate(ranks):  # a state of another bucket cut: refused on every rank, nothing changed
        other = rk["Birder-other-layout"]
        assert "ValueError: Birder: the optimizer state holds buckets of [1155, 416]" in other["error"], (r, other)
        assert "ValueError: Birder: the optimizer state (step 1) records no bucket cut" in other["none"], (r, other)
        assert other["unchanged"], f"rank {r}: a refused step changed the parameters or the state"
        for a, b in zip(other["then"], ranks[0]["Birder-other-layout"]["then"], strict=True):
            assert np.array_equal(a, b), f"rank {r}: the step after the refused one differs from rank 0"
    # Every train step in one tf.function call (steps_per_execution): the same parameters as the simulation.
    for r, rk in enumerate(ranks):
        for got, want in zip(rk["fit-steps_per_execution"], rk["simulated"][-1], strict=True):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-5, err_msg=f"steps_per_execution, rank {r} of {n}")
