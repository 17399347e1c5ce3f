"""Keras op=Adasum resumed from per-rank saves with the broadcast callback at the start of each fit continues exactly
as the uninterrupted run (Keras 3 and tf_keras): the callback broadcasts the model and what is alike on every rank,
not the inner optimizer's moments, which Adasum keeps per rank. For every op with per-rank state, rank 0's one file
saved after GatherPerRankStateCallback resumes exactly too, loaded on every rank or on rank 0 alone with the
broadcast callback; rank 0's file without it, loaded on rank 0 alone, warns on every rank."""

from __future__ import annotations

import pytest
from mpi_harness import keras_face_env, load_pickled_ranks, mpirun


@pytest.mark.parametrize("face", ["keras", "tf_keras"])
def test_keras_adasum_resume_with_broadcast_callback_is_exact(face: str, out_dir) -> None:
    env = keras_face_env(face)
    mpirun("keras_adasum_resume.py", 2, out_dir, face, timeout=300, env=env)
    ranks = load_pickled_ranks(out_dir, 2)
    for r, rk in enumerate(ranks):
        (want, want_loss), (got, got_loss) = rk["uninterrupted"], rk["resumed"]
        assert got_loss == want_loss, f"{face} rank {r}: epoch losses resumed {got_loss}, uninterrupted {want_loss}"
        assert got == want, f"{face} rank {r}: parameters after each epoch differ from the uninterrupted run"
        assert want == ranks[0]["uninterrupted"][0], f"{face}: rank {r} parameters differ from rank 0"
        for name in ("Adasum", "ZeroOneAdam", "Birder", "SLAMB"):
            want = rk[f"{name} uninterrupted"]
            for mode in ("gathered", "gathered_root"):
                assert rk[f"{name} {mode}"] == want, \
                    f"{face} op={name} rank {r}: resumed from rank 0's gathered file ({mode}) != the run never stopped"
                assert not rk[f"{name} {mode} warnings"], f"{face} op={name} rank {r} {mode}: warned"
            warned = rk[f"{name} plain_root warnings"]
            assert len(warned) == 1 and "this resume is not exact" in warned[0] \
                and "gather_per_rank_state()" in warned[0], f"{face} op={name} rank {r}: {warned}"
    for name in ("Adasum", "ZeroOneAdam", "Birder", "SLAMB"):  # not vacuous: the plain resume is inexact
        assert any(rk[f"{name} plain_root"] != rk[f"{name} uninterrupted"] for rk in ranks), f"{face} op={name}"
