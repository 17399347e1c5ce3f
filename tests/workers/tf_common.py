"""Shared bits of the TensorFlow/Keras workers: results as pickles (no torch import in a TF process)."""

from __future__ import annotations

import hashlib
import importlib
import pickle
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def out_dir() -> Path:
    return Path(sys.argv[1])


def save(rank: int, payload: dict[str, Any]) -> None:
    with open(out_dir() / f"rank{rank}.pkl", "wb") as f:
        pickle.dump(payload, f)


def digest(arrays: list[Any]) -> str:
    """A hash of the bytes of ``arrays`` (tensors or variables) in order."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(np.asarray(a)).tobytes())
    return h.hexdigest()


def outcome(fn: Callable[[], object]) -> str:
    """``"Type: message"`` of what ``fn()`` raised, or ``"no error"``."""
    try:
        fn()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


#: Options of each Keras algorithm op for a run of a few steps: every stage within them (warm-up, compression,
#: syncs).
ALGORITHM_OPTIONS = {
    "OneBitAdam": {"freeze_step": 2}, "OneBitLamb": {"freeze_step": 2},
    "ZeroOneAdam": {"var_freeze_step": 3, "local_step_scaler": 2, "local_step_clipper": 2},
    "SLAMB": {"compress_ratio": 0.5, "sync_interval": 3, "grad_size_thr": 0, "seed": 5}, "Birder": {"seed": 3},
}


def inner_optimizer(keras: Any, hck: Any, op: str, lr: float, **kwargs: Any) -> Any:
    """The Keras optimizer ``op`` wraps (``keras`` is Keras 3 or tf_keras): Birder's, Lamb where the Keras version
    has it for 1-bit LAMB and SLAMB, else Adam; ``kwargs`` go to it."""
    if op == "Birder":
        return (hck.legacy.Birder if keras.__name__ == "tf_keras" else hck.Birder)(lr, **kwargs)
    if op in ("OneBitLamb", "SLAMB") and hasattr(keras.optimizers, "Lamb"):
        return keras.optimizers.Lamb(lr, **kwargs)
    return keras.optimizers.Adam(lr, **kwargs)


def mse_step(model: Any, opt: Any, edit: Callable[[list[Any]], list[Any]] | None = None,
             after: Callable[[], None] | None = None) -> Callable[[Any, Any], None]:
    """A ``tf.function`` step of ``opt`` on the mean squared error of ``model`` at (x, y); ``edit`` changes the
    gradients before ``apply_gradients``, ``after`` runs after it (both traced into the step)."""
    import tensorflow as tf

    @tf.function
    def step(x: Any, y: Any) -> None:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
        variables = model.trainable_variables
        grads = tape.gradient(loss, variables)
        if edit is not None:
            grads = edit(grads)
        opt.apply_gradients(zip(grads, variables, strict=True))
        if after is not None:
            after()

    return step


def rank_data(rank: int) -> tuple[np.ndarray, np.ndarray]:
    """Each rank its own regression data: 64 rows of 6 features, y = sin(sum of x)."""
    x = np.random.default_rng(rank).standard_normal((64, 6)).astype("float32")
    return x, np.sin(x.sum(1, keepdims=True)).astype("float32")


def keras_of_face(face: str) -> Any:
    """The Keras module of a worker's face: ``tf_keras`` (TF_USE_LEGACY_KERAS=1) or Keras 3."""
    return importlib.import_module("tf_keras" if face == "tf_keras" else "keras")
