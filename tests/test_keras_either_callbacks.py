"""``hck.callbacks`` serve whichever Keras the model is (2 ranks): under ``TF_USE_LEGACY_KERAS=1`` the README's
``hck.callbacks.BroadcastGlobalVariablesCallback(0)`` in a tf_keras ``model.fit`` broadcasts the weights and
``MetricAverageCallback`` averages the epoch losses, as in Keras 3's."""

from __future__ import annotations

from mpi_harness import load_pickled_ranks, mpirun


def test_hck_callbacks_work_in_tf_keras_and_keras3_fit(out_dir) -> None:
    mpirun("keras_either_callbacks.py", 2, out_dir, timeout=300, env={"TF_USE_LEGACY_KERAS": "1"})
    ranks = load_pickled_ranks(out_dir, 2)
    for flavour in ("tf_keras", "keras3"):
        got = [rk[flavour] for rk in ranks]
        assert all(isinstance(g, dict) for g in got), f"{flavour}: {got}"
        assert got[0]["weights"] == got[1]["weights"], f"{flavour}: the ranks' weights differ after fit"
        assert got[0]["loss"] == got[1]["loss"], f"{flavour}: epoch losses not averaged: {got}"
