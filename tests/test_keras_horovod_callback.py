"""Horovod's own Keras ``BroadcastGlobalVariablesCallback`` on a model whose optimizer hvd_compress wrapped (a script
kept from Horovod): the broadcast when training begins, per-rank variables left alone, Horovod's resume recipe
(rank 0 alone reads the checkpoint) running past 1-bit Adam's warm-up, and rank 0's ``.keras`` file and its
``tf.train.Checkpoint`` loaded on every rank; Horovod's own optimizer untouched; and
``hvd.broadcast_variables(opt.variables)`` in Horovod's TF2 loop leaving the per-rank variables alone. Each
against a reference run that reaches the same state without the callback (``workers/keras_horovod_callback.py``)."""

from __future__ import annotations

import pytest
from mpi_harness import keras_face_env, load_pickled_ranks, mpirun


# The fast tier: each face once and each of 2 and 3 ranks once (tf_keras at 3, Keras 3 at 2); the long tier repeats
# tf_keras at 2 and 4.
@pytest.mark.parametrize(("face", "n"), [pytest.param("tf_keras", 2, marks=pytest.mark.long), ("tf_keras", 3),
                                           pytest.param("tf_keras", 4, marks=pytest.mark.long), ("keras", 2)])
def test_horovods_broadcast_callback_on_our_optimizer(face: str, n: int, out_dir) -> None:
    pytest.importorskip("horovod.tensorflow.keras")
    mpirun("keras_horovod_callback.py", n, out_dir, face, timeout=400, env=keras_face_env(face))
    ranks = load_pickled_ranks(out_dir, n)
    for r, rk in enumerate(ranks):
        where = f"{face} rank {r} of {n}"
        assert rk["start"] == "no error", f"{where}: {rk['start']}"
        assert rk["start_hash"] == rk["start_ref"], f"{where}: did not start from rank 0's weights"
        assert rk["start_hash"] == ranks[0]["start_hash"], f"{where}: parameters differ from rank 0's"
        assert rk["slamb"] == rk["slamb_ref"], f"{where}: SLAMB's per-rank moments were overwritten"
        assert rk["resume"] == "no error", f"{where}: Horovod's resume raised {rk['resume']}"
        assert rk["resume_compressed"], f"{where}: the resumed run is not past the warm-up"
        assert rk["rebuilt_kept"], f"{where}: optimizer.build() on the trained optimizer reset its state"
        assert rk["resume_hash"] == rk["resume_ref"], f"{where}: the resume differs from its reference"
        assert rk["resume_hash"] == ranks[0]["resume_hash"], f"{where}: resumed parameters differ from rank 0's"
        # rank 0's .keras file loaded on every rank: the others drop its error feedback, warned
        assert rk["file_hash"] == rk["resume_ref"], f"{where}: rank 0's file resumed with rank 0's error feedback"
        warned = rk["file_warnings"]
        assert (len(warned) == 1 and f"written by rank 0; rank {r} starts its error feedback from zero" in warned[0]
                if r else not warned), f"{where}: {warned}"
        # rank 0's tf.train.Checkpoint restored on every rank: the same, at the first step
        assert rk["ckpt_hash"] == rk["resume_ref"], f"{where}: rank 0's checkpoint resumed with rank 0's error feedback"
        warned = rk["ckpt_warnings"]
        assert (len(warned) == 1 and f"that rank 0 wrote; rank {r} starts its error feedback from zero" in warned[0]
                if r else not warned), f"{where}: {warned}"
        if face == "tf_keras":
            assert rk["plain"] == rk["plain_horovod"], f"{where}: Horovod's own optimizer ran another way"
            assert rk["loop"] == rk["loop_ref"], f"{where}: hvd.broadcast_variables overwrote SLAMB's moments"
            (kernel, local), own = rk["local"]
            assert kernel == ranks[0]["local"][0][0], f"{where}: a kernel was not broadcast"
            assert local == own, f"{where}: Horovod's local_variables= was broadcast"
            assert r == 0 or local != ranks[0]["local"][1], f"{where}: the local kernel alike: the case tests nothing"
    assert len({rk["slamb"] for rk in ranks}) > 1, "SLAMB's ranks alike: the case would not test per-rank moments"
