"""HDF5 checkpoints (``model.save("....h5")``) of a model compiled with hck's optimizer: tf_keras resumes bit for bit,
Keras 3 trains on from a fresh optimizer as its own optimizers do; Horovod's ``hvd.load_model`` of such a file is
Keras's own load (``workers/keras_h5.py``)."""

from __future__ import annotations

import pytest
from mpi_harness import keras_face_env, load_pickled_ranks, mpirun

OPS = ("Average", "OneBitAdam", "PowerSGD", "Adasum")


# The fast tier: each face once and each of 2 and 3 ranks once (tf_keras at 3, Keras 3 at 2); the long tier repeats
# tf_keras at 2 and 4.
@pytest.mark.parametrize(("face", "n"), [pytest.param("tf_keras", 2, marks=pytest.mark.long), ("tf_keras", 3),
                                           pytest.param("tf_keras", 4, marks=pytest.mark.long), ("keras", 2)])
def test_hdf5_checkpoint_of_our_optimizer(face: str, n: int, out_dir) -> None:
    pytest.importorskip("h5py")
    pytest.importorskip("horovod.tensorflow.keras")
    mpirun("keras_h5.py", n, out_dir, face, timeout=400, env=keras_face_env(face))
    ranks = load_pickled_ranks(out_dir, n)
    for r, rk in enumerate(ranks):
        for op in OPS:
            where = f"{face} {op}, rank {r} of {n}"
            assert rk[f"{op}_resume"] == "no error", f"{where}: {rk[f'{op}_resume']}"
            assert rk[f"{op}_class"].startswith("hvd_compress.keras"), f"{where}: loaded {rk[f'{op}_class']}"
            assert rk[f"{op}_hvd_resume"] == "no error", f"{where}: hvd.load_model: {rk[f'{op}_hvd_resume']}"
            assert not rk[f"{op}_hvd_inner"].startswith("horovod"), f"{where}: Horovod wrapped the inner optimizer"
            assert rk[f"{op}_hvd_resumed"] == rk[f"{op}_resumed"], f"{where}: hvd.load_model resumed another way"
            if face == "tf_keras":
                assert rk[f"{op}_resumed"] == rk[f"{op}_uninterrupted"], f"{where}: the resumed run differs"
            assert rk[f"{op}_resumed"] == ranks[0][f"{op}_resumed"], f"{where}: parameters differ from rank 0"
