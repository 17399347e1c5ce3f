"""hck.callbacks.LearningRateWarmupCallback / LearningRateScheduleCallback and their tf_keras twins against Horovod's
rule computed here, with hvd_compress's 1-bit Adam and a plain Keras optimizer (``workers/keras_lr_callbacks.py``)."""

from __future__ import annotations

import numpy as np
import pytest
from mpi_harness import keras_face_env, load_pickled_ranks, mpirun

STEPS, EPOCHS, WARMUP, LR = 4, 4, 2, 0.01


def warmup_rates(size: int) -> list[float]:
    """Horovod's LearningRateWarmupCallback: lr / size * (epoch * (size - 1) / warmup + 1) at each batch of the
    warm-up, epoch = e + (b + 1) / steps; after it the last rate stays."""
    rates = [LR / size * ((e + (b + 1) / STEPS) * (size - 1) / WARMUP + 1) for e in range(WARMUP) for b in range(STEPS)]
    return rates + [rates[-1]] * (EPOCHS - WARMUP) * STEPS


def schedule_rates() -> list[float]:
    """LearningRateScheduleCallback(0.01, 0.5, start_epoch=1, end_epoch=3), staircase, on Adam(0.02)."""
    per_epoch = [0.02, LR, LR * 0.5, LR * 0.5]
    return [lr for lr in per_epoch for _ in range(STEPS)]


# The fast tier: each face once and each of 2 and 3 ranks once (Keras 3 at 3, tf_keras at 2); the long tier repeats
# Keras 3 at 2 and 4.
@pytest.mark.parametrize(("face", "n"), [pytest.param("keras", 2, marks=pytest.mark.long), ("keras", 3),
                                           pytest.param("keras", 4, marks=pytest.mark.long), ("tf_keras", 2)])
def test_learning_rate_callbacks_follow_horovods_rule(face: str, n: int, out_dir) -> None:
    mpirun("keras_lr_callbacks.py", n, out_dir, face, timeout=400, env=keras_face_env(face))
    ranks = load_pickled_ranks(out_dir, n)
    want_warmup, want_schedule = warmup_rates(n), schedule_rates()
    for r, rk in enumerate(ranks):
        where = f"{face} rank {r} of {n}"
        for name in ("onebit", "adam"):
            params, logged, seen = rk[f"warmup_{name}"]
            np.testing.assert_allclose(seen, want_warmup, rtol=1e-6, err_msg=f"{where} {name}: warm-up rates")
            np.testing.assert_allclose(logged, [want_warmup[(e + 1) * STEPS - 1] for e in range(EPOCHS)], rtol=1e-6,
                                       err_msg=f"{where} {name}: logs['lr'] at each epoch's end")
            assert params == rk[f"warmup_{name}_by_hand"], f"{where} {name}: the step did not take the warm-up's rate"
            assert params != rk[f"constant_{name}"], f"{where} {name}: the rates changed nothing"
            params, logged, seen = rk[f"schedule_{name}"]
            np.testing.assert_allclose(seen, want_schedule, rtol=1e-6, err_msg=f"{where} {name}: schedule rates")
        assert rk["warmup_onebit"][0] == ranks[0]["warmup_onebit"][0], f"{where}: 1-bit Adam ranks differ"
        momentum, warned = rk["float_momentum"]
        assert momentum == [0.9] * 8 and len(warned) == 1, f"{where}: a number momentum: {momentum}, {warned}"
        if face == "tf_keras":  # Goyal et al.'s correction for the batch that changes the rate, then restored
            rates, momentum, after = rk["variable_momentum"]
            np.testing.assert_allclose(rates, [LR] * 4 + [LR * 0.5] * 4, rtol=1e-6)
            np.testing.assert_allclose(momentum, [0.9 * LR / 0.02, 0.9, 0.9, 0.9, 0.9 * 0.5, 0.9, 0.9, 0.9], rtol=1e-6)
            np.testing.assert_allclose(after, [0.9] * 8, rtol=1e-6)
