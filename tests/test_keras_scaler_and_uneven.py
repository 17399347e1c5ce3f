"""Keras 3 and tf_keras at 2 and 3 ranks, one launch each (``workers/keras_scaler_and_uneven.py``):

- A loss scaler goes around ``hck.DistributedOptimizer``: with the agreed scaler around it (``hck.LossScaleOptimizer``,
  ``legacy.LossScaleOptimizer``) every op's ``model.fit`` update is the unscaled run's bit for bit (the scale is a
  power of two, so scaling the loss and dividing the gradients is exact in float32 where nothing overflows); so is
  it with Keras 3's fixed loss scale on the inner optimizer (``loss_scale_factor``, which the wrapper applies). A loss
  scaler inside (Keras's own or ours, also where a script that had Keras's follows our advice to put ours around) is
  refused at construction on every rank, for every op, naming the order to use; Keras's own around it is refused
  in ``fit`` (its skip decision is per rank).
- Uneven data in ``fit()`` (rank 1 13 batches, rank 0 22, rank 2 17): every rank raises within 10 s, naming the step
  counts: each rank's where ``fit`` knows the length (arrays), where it does not (a generator) the count of the
  rank that ended first; the ranks still stepping name it as the one that joined.
- ``hck`` exports the TensorFlow face's error classes and ``DistributedGradientTape``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from mpi_harness import keras_face_env, load_pickled_ranks, mpirun

OPS = ["Average", "Sum", "Adasum", "PowerSGD", "TopK", "OneBitAdam", "OneBitLamb", "ZeroOneAdam", "SLAMB", "Birder",
       "SignSGD"]
#: At 3 ranks one op of each kind (dense, delta-reduced, 1-bit, masked, quantized update): TensorFlow ranks are slow
#: to step on a 2-core CI host, and what the scaler does is decided per kind, not per op.
OPS_AT_3 = ["Average", "Adasum", "OneBitAdam", "SLAMB", "Birder"]
BATCHES = {0: 22, 1: 13}  # rank 2: 17


# The fast tier: every op on each face at 2 ranks, and Keras 3 at 3; the long tier repeats tf_keras at 3.
@pytest.fixture(scope="module", params=[("keras", 2), ("keras", 3), ("tf_keras", 2),
                                        pytest.param(("tf_keras", 3), marks=pytest.mark.long)],
                ids=lambda p: f"{p[0]}-{p[1]}")
def ranks(request, tmp_path_factory) -> tuple[str, int, list[dict]]:
    face, n = request.param
    env = {**(keras_face_env(face) or {}), "HVDC_TIMEOUT": "60"}  # a regression fails in a minute, not 300 s
    out: Path = tmp_path_factory.mktemp(f"{face}{n}")
    mpirun("keras_scaler_and_uneven.py", n, out, face, ",".join(ops_at(n)), timeout=400, env=env)
    return face, n, load_pickled_ranks(out, n)


def ops_at(n: int) -> list[str]:
    return OPS if n == 2 else OPS_AT_3


def test_loss_scaler_around_the_wrapper_gives_the_unscaled_update_for_every_op(ranks) -> None:
    face, n, got = ranks
    for op in ops_at(n):
        for r, rk in enumerate(got):
            where = f"{face} op={op}, rank {r} of {n}"
            moved = max(float(np.abs(a - b).max()) for a, b in zip(rk[f"plain/{op}"], rk["start"], strict=True))
            assert moved > 1e-4, f"{where}: the unscaled run moved the weights by {moved} only: the test tests nothing"
            for i, (a, b) in enumerate(zip(rk[f"around/{op}"], rk[f"plain/{op}"], strict=True)):
                np.testing.assert_array_equal(a, b, err_msg=f"{where}: weight {i} with the loss scaler around the "
                                                            "wrapper differs from the run without it")
            assert rk[f"scale/{op}"] == 2.0**15, f"{where}: loss scale {rk[f'scale/{op}']}, none skipped: 2**15"
            if face == "keras":  # the inner optimizer's fixed loss scale: the wrapper's scale_loss applies it
                for i, (a, b) in enumerate(zip(rk[f"factor/{op}"], rk[f"plain/{op}"], strict=True)):
                    np.testing.assert_array_equal(a, b, err_msg=f"{where}: weight {i} with loss_scale_factor=1024 on "
                                                                "the inner optimizer differs from the run without it")
            np.testing.assert_array_equal(rk[f"around/{op}"][0], got[0][f"around/{op}"][0], err_msg=where)


def test_loss_scaler_inside_the_wrapper_is_refused_at_construction_on_every_rank(ranks) -> None:
    face, n, got = ranks
    order = ("hvd_compress.keras.legacy.LossScaleOptimizer(hck.DistributedOptimizer(opt" if face == "tf_keras" else
             "hck.LossScaleOptimizer(hck.DistributedOptimizer(opt")
    for op in ops_at(n):
        for r, rk in enumerate(got):
            for key in (f"inside/keras/{op}", f"inside/ours/{op}", f"advice/{op}"):
                said = rk[key]
                assert said.startswith("TypeError") and "loss scaler" in said and order in said, (
                    f"{face} {key}, rank {r} of {n}: {said}")
    for r, rk in enumerate(got):  # Keras's own around it: its per-rank skip decision is refused in fit
        said = rk["outside"]
        assert "ValueError" in said and order.split("(hck.", maxsplit=1)[0] + "(hck.DistributedOptimizer(" in said, (
            f"{face}: Keras's own loss scaler around the wrapper, rank {r} of {n}: {said}")


def test_uneven_data_in_fit_raises_on_every_rank_within_seconds_naming_the_step_counts(ranks) -> None:
    face, n, got = ranks
    counts = [BATCHES.get(r, 17) for r in range(n)]
    assert [rk["uneven/known"]["batches"] for rk in got] == counts
    for r, rk in enumerate(got):
        known = rk["uneven/known"]
        where = f"{face}, known length, rank {r} of {n}"
        assert known["mismatch"], f"{where}: not hck.MismatchError: {known['raised']}"
        assert known["seconds"] < 10, f"{where}: raised after {known['seconds']:.1f} s"
        for q, c in enumerate(counts):
            assert f"rank {q}={c}" in known["raised"], f"{where}: rank {q}'s {c} steps not named: {known['raised']}"
    unknown = [rk["uneven/unknown"] for rk in got]
    spread = max(u["at"] for u in unknown) - min(u["at"] for u in unknown)
    assert spread < 10, f"{face}, unknown length, n={n}: the ranks raised {spread:.1f} s apart"
    for r, u in enumerate(unknown):
        where = f"{face}, unknown length, rank {r} of {n}"
        assert u["raised"] != "no error" and "uneven data" in u["raised"], f"{where}: {u['raised']}"
        assert "rank(s) 1 called join()" in u["raised"], f"{where}: the rank that ended first not named: {u['raised']}"
        assert "CommTimeoutError" not in u["raised"], f"{where}: {u['raised']}"
    assert unknown[1]["mismatch"] and "after 13 steps" in unknown[1]["raised"], unknown[1]["raised"]


def test_hck_exports_the_error_classes_and_distributed_gradient_tape(ranks) -> None:
    face, _, got = ranks
    for r, rk in enumerate(got):
        missing = [name for name, same in rk["exports"].items() if not same]
        assert not missing, f"{face}, rank {r}: hck lacks (or has another) {missing}"
