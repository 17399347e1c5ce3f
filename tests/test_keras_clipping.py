"""The inner optimizer's ``clipnorm``, ``global_clipnorm`` and ``clipvalue`` under the Keras algorithm ops, both
faces, 2 ranks: Keras's own optimizers clip in ``apply``; the algorithm ops step the variables themselves, so the
wrapper clips each rank's gradient by the inner optimizer's rule before the algorithm. The variables after 8 steps
equal, bit for bit, those of the same run with each rank's gradients clipped by hand (Keras's ``_clip_gradients``
of an unwrapped optimizer) before ``apply_gradients``; the clip acted (without it the run differs); the ranks agree
(SLAMB's and 0/1 Adam's after ``synchronize_parameters()``); ``model.fit`` takes the option too; set on the
wrapper after construction (as on Horovod's, a subclass of the optimizer) it is the inner optimizer's, also under
op=Average, where the inner optimizer clips the average. So are AdamW's ``weight_decay`` set on the wrapper and
its ``beta_1`` set on the inner optimizer after wrapping (the algorithm ops read them when their step is traced, as
Keras's own optimizers do)."""

from __future__ import annotations

import numpy as np
import pytest
from mpi_harness import keras_face_env, load_pickled_ranks, mpirun

CASES = ["OneBitAdam:clipnorm", "OneBitAdam:global_clipnorm", "OneBitAdam:clipvalue", "OneBitLamb:clipnorm",
         "ZeroOneAdam:global_clipnorm", "SLAMB:clipnorm", "Birder:clipnorm", "Average:clipnorm"]
#: Where the inner optimizer clips (the average), not each rank's gradient before an algorithm.
INNER_CLIPS = ("Average:clipnorm",)


@pytest.mark.parametrize("face", ["keras", "tf_keras"])
def test_inner_optimizer_clipping_clips_each_ranks_gradient_before_the_algorithm(face: str, out_dir) -> None:
    env = keras_face_env(face)
    cases = [c for c in CASES if face == "keras" or not c.startswith("SLAMB")]  # SLAMB wraps Keras 3's Lamb only
    mpirun("keras_clipping.py", 2, out_dir, face, ",".join(cases), timeout=400, env=env)
    ranks = load_pickled_ranks(out_dir, 2)
    for r, rk in enumerate(ranks):
        for case in cases:
            got = rk[case]
            for i, (x, y) in enumerate(zip(got["clipped"], got["on_wrapper"], strict=True)):
                np.testing.assert_array_equal(x, y, err_msg=f"{face} {case} rank {r}: set on the wrapper, variable {i}")
            if case not in INNER_CLIPS:
                for i, (x, y) in enumerate(zip(got["clipped"], got["by_hand"], strict=True)):
                    np.testing.assert_array_equal(x, y, err_msg=f"{face} {case} rank {r}: variable {i}")
            assert any(not np.array_equal(x, y) for x, y in zip(got["clipped"], got["free"], strict=True)), (
                f"{face} {case} rank {r}: clipping changed nothing (test too weak)")
            for i, (x, y) in enumerate(zip(got["clipped"], ranks[0][case]["clipped"], strict=True)):
                np.testing.assert_array_equal(x, y, err_msg=f"{face} {case}: ranks differ, variable {i}")
            assert isinstance(got["fit"], list), f"{face} {case} rank {r}: model.fit raised {got['fit']}"
        # AdamW's weight_decay set on the wrapper and beta_1 on the inner optimizer after wrapping count, as given
        for op in ("OneBitAdam", "Average"):
            got = rk[op]
            for i, (x, y) in enumerate(zip(got["late"], got["given"], strict=True)):
                np.testing.assert_array_equal(x, y, err_msg=f"{face} {op} rank {r}: set after wrapping, variable {i}")
            assert any(not np.array_equal(x, y) for x, y in zip(got["late"], got["default"], strict=True)), (
                f"{face} {op} rank {r}: the late settings changed nothing (test too weak)")
