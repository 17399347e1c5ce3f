"""Keras's ``exclude_from_weight_decay`` under the ops that apply weight decay in their own rule (1-bit Adam, 0/1 Adam,
1-bit LAMB, SLAMB, Birder), Keras 3 and tf_keras, 2 ranks: an excluded variable does not decay (steps of zero gradients
leave it, the others shrink; not Birder, whose step of a zero gradient is lr), the ranks agree, a
``tf.train.Checkpoint`` per rank resumes bit for bit, and one written with other exclusions (or none) is refused on
every rank (the flat state's variable order follows them), as are exclusions changed after the first step. Set on the
wrapper (Horovod's wrapper is a subclass of the optimizer, so scripts call it there), they reach the inner optimizer,
also under op=Average, and a model saved with ``model.save`` and reloaded with ``load_model`` keeps them (Keras's own
config does not) and continues exactly. The steps themselves are compared with the torch face's param group of
weight_decay 0 in ``test_tensorflow.py`` (tf_parity.py's "no decay" cases)."""

from __future__ import annotations

import numpy as np
import pytest
from mpi_harness import keras_face_env, load_pickled_ranks, mpirun

OPS = ["OneBitAdam", "ZeroOneAdam", "OneBitLamb", "SLAMB", "Birder"]


@pytest.mark.parametrize("face", ["keras", "tf_keras"])
def test_variables_excluded_from_weight_decay_stay_and_resume_exactly(face: str, out_dir) -> None:
    env = keras_face_env(face)
    ops = [op for op in OPS if face == "keras" or op != "SLAMB"]  # SLAMB wraps Keras 3's Lamb only
    mpirun("keras_no_decay.py", 2, out_dir, face, ",".join(ops), timeout=300, env=env)
    ranks = load_pickled_ranks(out_dir, 2)
    for r, rk in enumerate(ranks):  # set on the wrapper, as on Horovod's: forwarded to the inner optimizer
        assert rk["Average"]["decayed"] == [False, True, False], f"{face} Average rank {r}: {rk['Average']}"
        for op, moved in rk["scaled"].items():  # and through the loss-scaling wrapper around it
            assert moved == [False, True, False], f"{face} {op} under the loss scaler, rank {r}: {moved}"
    for op in ["Average", *ops]:  # model.save, load_model: the exclusions kept, the next epoch exactly as continued
        for r, rk in enumerate(ranks):
            got = rk[op]
            assert got["bias_excluded"] and all(got["bias_excluded"]), (
                f"{face} {op} rank {r}: the reloaded optimizer decays the biases: {got['bias_excluded']}")
            for i, (x, y) in enumerate(zip(got["reloaded"], got["continued"], strict=True)):
                np.testing.assert_array_equal(x, y, err_msg=f"{face} {op} rank {r}: reloaded model, variable {i}")
    for op in ops:
        for r, rk in enumerate(ranks):
            got = rk[op]
            if op != "Birder":  # Birder steps a zero gradient by +lr (its 1-bit sign of 0): the parity test's
                assert got["decayed"] == [False, True, False], (
                    f"{face} {op} rank {r}: moved on weight decay alone: {got['decayed']} (0 and 2 are excluded)")
            for t, (a, b) in enumerate(zip(got["resumed"], got["uninterrupted"][4:], strict=True)):
                for i, (x, y) in enumerate(zip(a, b, strict=True)):
                    np.testing.assert_array_equal(x, y, err_msg=f"{face} {op} rank {r}: resumed step {t + 4}, v{i}")
            assert "ValueError" in got["other"] and "excluded from weight decay" in got["other"], (
                f"{face} {op} rank {r}: a checkpoint of other exclusions: {got['other']}")
            # none excluded on restore: one bucket, the same shapes; 0/1 Adam's per-bucket state has other variables
            # (its float64 error_lr per bucket first), which TensorFlow's restore refuses by dtype
            if op == "ZeroOneAdam":
                assert "InvalidArgumentError" in got["none"] and "does not equal original dtype" in got["none"], (
                    f"{face} {op} rank {r}: a checkpoint with exclusions restored with none: {got['none']}")
            else:
                assert "ValueError" in got["none"] and "excluded from weight decay" in got["none"], (
                    f"{face} {op} rank {r}: a checkpoint with exclusions restored with none: {got['none']}")
            for late in ("late_wrapper", "late_inner"):
                assert "ValueError" in got[late] and "exclude_from_weight_decay" in got[late], (
                    f"{face} {op} rank {r}: exclusions changed after the first step ({late}): {got[late]}")
        for t in range(8):  # 0/1 Adam too: its schedule here syncs every step
            for i in range(3):
                np.testing.assert_array_equal(ranks[1][op]["uninterrupted"][t][i], ranks[0][op]["uninterrupted"][t][i],
                                              err_msg=f"{face} {op}: ranks differ at step {t}, v{i}")
