"""Keras variable constraints (a layer's ``kernel_constraint``) under every op of both Keras faces, 2 ranks: the
variables after 8 steps equal, bit for bit, those of the same run with the constraints applied by hand after each step
(not Adasum: its local step applies them too), they hold, and without them they would have acted (the max-norm layer
outgrows 0.3, the non-negative one goes below 0). Keras's own optimizers apply constraints in ``apply``; the algorithm
ops step the variables themselves, and Adasum's combined delta comes after the inner optimizer's step, so the wrapper
applies them there."""

from __future__ import annotations

import numpy as np
import pytest
from mpi_harness import keras_face_env, load_pickled_ranks, mpirun

OPS = ["Average", "Adasum", "OneBitAdam", "ZeroOneAdam", "OneBitLamb", "SLAMB", "Birder"]


@pytest.mark.parametrize("face", ["keras", "tf_keras"])
def test_variable_constraints_apply_after_every_step(face: str, out_dir) -> None:
    env = keras_face_env(face)
    ops = [op for op in OPS if face == "keras" or op != "SLAMB"]  # SLAMB wraps Keras 3's Lamb only
    mpirun("keras_constraints.py", 2, out_dir, face, ",".join(ops), timeout=300, env=env)
    ranks = load_pickled_ranks(out_dir, 2)
    for r, rk in enumerate(ranks):
        for op in ops:
            got = rk[op]
            if op != "Adasum":  # whose inner optimizer also applies them in its local step, out of reach by hand
                for i, (x, y) in enumerate(zip(got["constrained"], got["by_hand"], strict=True)):
                    np.testing.assert_array_equal(x, y, err_msg=f"{face} {op} rank {r}: variable {i}")
            if op not in ("SLAMB", "ZeroOneAdam"):  # local steps between syncs; the others keep the ranks alike
                for i, (x, y) in enumerate(zip(got["constrained"], ranks[0][op]["constrained"], strict=True)):
                    np.testing.assert_array_equal(x, y, err_msg=f"{face} {op}: ranks differ, variable {i}")
            norms = np.sqrt((got["constrained"][0] ** 2).sum(axis=0))
            assert norms.max() <= 0.3 + 1e-6 and got["constrained"][2].min() >= 0, f"{face} {op} rank {r}"
            free_norms = np.sqrt((got["free"][0] ** 2).sum(axis=0))
            assert free_norms.max() > 0.31 and got["free"][2].min() < 0, (
                f"{face} {op} rank {r}: the constraints would not have acted: {free_norms.max()}, "
                f"{got['free'][2].min()}")


def test_float8_scales_are_refused_where_they_would_be_stepped(out_dir) -> None:
    """Keras 3's float8 training (``model.quantize("float8")``) overwrites its scales and amax histories with their
    gradients (``overwrite_with_gradient``): op=Average leaves that to Keras; the algorithm ops, which step every
    variable as a parameter, and top-k's error feedback raise ValueError on every rank."""
    env = keras_face_env("keras")
    mpirun("keras_constraints.py", 2, out_dir, "keras", "Average", timeout=300, env=env)
    for r, rk in enumerate(load_pickled_ranks(out_dir, 2)):
        got = rk["float8"]
        assert got["Average"] == "no error", f"rank {r}: {got['Average']}"
        for what in ("OneBitAdam", "ZeroOneAdam", "topk"):
            assert got[what].startswith("ValueError") and "overwrite_with_gradient" in got[what], (
                f"rank {r} {what}: {got[what]}")
