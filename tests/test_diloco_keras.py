"""hck.DistributedOptimizer(op=hck.DiLoCo) in Keras 3 (2 ranks) and tf_keras (3 ranks) against the NumPy reference
(hvd_compress/reference/diloco.py) on the task of tests/workers/diloco_task.py, the torch test's: every rank's
variables after every step of every config (streaming with delay and mix, every outer_compression); a run resumed
from the optimizer's variables mid-phase, a sync in flight, continues bit for bit; one config inside a tf.function;
the per-rank variables; bad options raise on every rank."""

from __future__ import annotations

import numpy as np
import pytest
from mpi_harness import load_pickled_ranks, mpirun
from workers.diloco_task import CONFIGS, RESUMES, SIZES, STEPS, initial, inner_step

from hvd_compress.reference.diloco import ReferenceDiLoCo

pytest.importorskip("tensorflow")


def check(got: np.ndarray, want: np.ndarray, exact: bool, where: str) -> None:
    diff = float(np.abs(got - want).max())
    if exact:
        assert np.array_equal(got, want), f"{where}: differs from the reference by {diff:.3g}"
    else:  # MPI's float32 sum of 3 ranks against the reference's exact one (as tests/test_diloco.py)
        assert diff <= 1e-6 * max(1.0, float(np.abs(want).max())), f"{where}: differs from the reference by {diff:.3g}"


@pytest.mark.parametrize(("flavour", "n"), [("keras", 2), ("tf_keras", 3)])
def test_keras_diloco_matches_reference(flavour: str, n: int, out_dir) -> None:
    env = {"TF_USE_LEGACY_KERAS": "1"} if flavour == "tf_keras" else None
    mpirun("keras_diloco.py", n, out_dir, env=env, timeout=400)
    ranks = load_pickled_ranks(out_dir, n)
    for name, options in CONFIGS.items():
        ref = ReferenceDiLoCo([initial()] * n, SIZES, **options)
        want = [ref.run(inner_step) for _ in range(STEPS)]
        exact = n == 2 or options.get("outer_compression", "none") != "none"
        for r, got in enumerate(ranks):
            for t in range(STEPS):
                check(got["runs"][name][t], want[t][r], exact, f"{flavour}, {name}, {n} ranks, rank {r}, step {t}")
            if name == "stream":
                for t in range(STEPS):
                    assert np.array_equal(got["function"][t], got["runs"][name][t]), \
                        f"{flavour}, rank {r}, step {t}: inside a tf.function differs from eager"
    for r, got in enumerate(ranks):
        for name, options in CONFIGS.items():  # the variables go to NumPy only at the steps a sync starts or merges
            h, delay = options["sync_every"], options.get("sync_delay", 0)
            offsets = {(f + 1) * h // options.get("fragments", 1) % h for f in range(options.get("fragments", 1))}
            due = [t for t in range(1, STEPS + 1)
                   if t % h in offsets or (t - delay >= 1 and (t - delay) % h in offsets)]
            assert got["copies"][name] == len(due), \
                f"{flavour}, {name}, rank {r}: {got['copies'][name]} copies to NumPy in {STEPS} steps, want {len(due)}"
        for name, at in RESUMES:
            want, resumed = got["resumed"][f"{name}@{at}"]
            for t, (a, b) in enumerate(zip(want, resumed, strict=True)):
                assert np.array_equal(a, b), f"{flavour}, {name} resumed after step {at}, rank {r}, step {at + t}"
        assert any("diloco_error" in v for v in got["per_rank"]) and any("diloco_sent" in v for v in got["per_rank"])
        bad = got["bad"]
        for case, kind in (("sync_every0", "ValueError"), ("mix1", "ValueError"), ("compression", "ValueError"),
                           ("unknown", "TypeError"), ("bucket", "TypeError"),
                           ("fragments_over_variables", "ValueError")):
            assert bad[case].startswith(kind + ":"), f"{flavour}, rank {r}, {case}: {bad[case]}"
