"""Horovod's Keras entry point accepts hvd_compress's ops: with ``hvd_compress.keras`` imported,
``horovod.tensorflow.keras.DistributedOptimizer(opt, op=hc.OneBitAdam, freeze_step=...)`` (and
``horovod.keras.DistributedOptimizer``) return ``hvd_compress.keras.DistributedOptimizer``.

Which ops are routed and the switch (``HVDC_HOROVOD_ENTRY=0``, ``hck.horovod_entry(False)``) are shared with the
torch face: ``hvd_compress.ops.horovod_entry``. Horovod's Keras wrapper takes arguments ours does not; a routed
call keeps ``optimizer``, ``op``, ``name``, ``backward_passes_per_step`` (Horovod's default sums the k
gradients, as ours) and ``average_aggregated_gradients`` (averages them instead, in both), drops
``sparse_as_dense`` (the Keras face densifies ``IndexedSlices`` either way), accepts the global ``process_set``,
drops any other argument at Horovod's default and refuses one set otherwise.

Horovod's ``BroadcastGlobalVariablesCallback`` (``hvd.callbacks``) broadcasts after the first batch, every optimizer
variable included. On a model whose optimizer hvd_compress wrapped, that first batch steps each rank from its own
state: in a resume where only rank 0 loaded the checkpoint, rank 0 is past 1-bit Adam's warm-up and the others are
in it, so their collectives differ and every rank raises; and the broadcast then hands every rank rank 0's error
feedback and per-rank moments (SLAMB's). So with ``hvd_compress.keras`` imported that callback, on such a model,
broadcasts as ``hck.callbacks.BroadcastGlobalVariablesCallback`` does: when training begins,
leaving ``per_rank_variables`` (and Horovod's ``local_variables``) alone. On any other model it is Horovod's.
``horovod.tensorflow.join()`` runs ``hck.join()`` first once hvd_compress's runtime runs (``join_first``), and
Horovod's ``load_model`` of a file whose optimizer is ours is Keras's own (``_saved_with_ours``);
``horovod.tensorflow.broadcast_variables`` leaves our optimizers' per-rank variables alone (``_holds_per_rank``).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import os
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hvd_compress.keras.callbacks import broadcast_model, distributed
from hvd_compress.keras.engine import per_rank_ids
from hvd_compress.ops.horovod_entry import Extended, Routed, Target, horovod_entry, join_first, register
from hvd_compress.ops.process_sets import check_process_set

__all__ = ["horovod_entry", "install_from_environment"]

_MARK = "hvd_compress"  # in a saved model's optimizer config: its module or registered name

_KEPT = ("optimizer", "op", "name", "backward_passes_per_step", "average_aggregated_gradients")


def _arguments(signature: inspect.Signature, given: dict[str, Any]) -> dict[str, Any]:
    """Horovod's Keras ``DistributedOptimizer`` arguments as ``hck.DistributedOptimizer`` keyword arguments."""
    kept = {}
    for key, value in given.items():
        default = signature.parameters[key].default
        if key in _KEPT:
            kept[key] = value
        elif key == "process_set":
            check_process_set(value)
        elif key != "sparse_as_dense" and not (value is default or value == default):
            raise TypeError(
                f"hvd.DistributedOptimizer(op=hc.{given['op'].name}) runs hvd_compress.keras.DistributedOptimizer, "
                f"which has no {key}= (given {value!r}; Horovod's default {default!r}); leave it out"
            )
    return kept


def _broadcast_when_training_begins(on_train_begin: Callable[..., Any]) -> Callable[..., Any]:
    """Horovod's ``BroadcastGlobalVariablesCallback.on_train_begin`` as this module's docstring gives it."""

    @functools.wraps(on_train_begin)
    def extended(self: Any, logs: Any = None) -> None:
        on_train_begin(self, logs)
        if not self.broadcast_done and distributed(getattr(self.model, "optimizer", None)) is not None:
            broadcast_model(self.model, self.root_rank, local=self._local_vars)
            self.broadcast_done = True  # Horovod's on_batch_end then leaves it

    return extended


def _saved_with_ours(given: dict[str, Any]) -> bool:
    """Whether the model file given to Horovod's ``load_model`` was compiled with one of hvd_compress's optimizers:
    its training config (HDF5), ``config.json`` (``.keras``) or metadata (a SavedModel directory) names the
    package. Horovod's own ``load_model`` would put its DistributedOptimizer around the wrapped optimizer (its
    gradients reduced a second time, Adasum's per-rank ones averaged)."""
    filepath = given.get("filepath")
    if hasattr(filepath, "attrs"):  # an open h5py.File
        return _MARK in str(filepath.attrs.get("training_config", ""))
    path = os.fspath(filepath)
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            return _MARK in archive.read("config.json").decode("utf-8", "replace")
    if os.path.isdir(path):
        meta = Path(path) / "keras_metadata.pb"
        return meta.exists() and _MARK.encode() in meta.read_bytes()
    if not os.path.isfile(path):
        return False  # Horovod's own reports the missing file
    import h5py

    try:
        with h5py.File(path, "r") as f:
            return _MARK in str(f.attrs.get("training_config", ""))
    except OSError:  # no HDF5 file: Horovod's own says what it is not
        return False


def _load_with(keras_module: Any) -> Callable[..., Any]:
    """Horovod's ``load_model`` for a file of ours: Keras's own ``load_model`` of ``keras_module`` (the wrapper and
    its inner optimizer come back as saved); Horovod's wrapping arguments do not apply."""

    def load_model(filepath: Any, custom_optimizers: Any = None, custom_objects: Any = None, compression: Any = None,
                   legacy_opts: bool = False) -> Any:
        if compression is not None and getattr(compression, "__name__", "") != "NoneCompressor":
            raise ValueError("hvd.load_model: the file's optimizer is hvd_compress's, whose compression is saved with "
                             f"it; leave compression= out (given {compression!r})")
        return keras_module.models.load_model(filepath, custom_objects=custom_objects)

    return load_model


def _holds_per_rank(given: dict[str, Any]) -> bool:
    """Whether Horovod's ``broadcast_variables`` was given a list holding per-rank variables of our optimizers
    (Horovod's TF2 examples broadcast ``opt.variables`` after the first step)."""
    variables = given.get("variables")
    if not isinstance(variables, list | tuple):
        return False  # an iterator would be used up here: Horovod's own takes it
    own = per_rank_ids()
    return any(id(v) in own for v in variables)


def _broadcast_but_per_rank(horovods: Callable[..., Any]) -> Callable[..., Any]:
    """Horovod's ``broadcast_variables`` (``horovods``) of the variables but our optimizers' per-rank ones, which
    each rank keeps (error feedback, SLAMB's moments, Birder's shards), as ``hck.broadcast_variables`` callers and
    the broadcast callbacks leave them."""

    def broadcast_variables(variables: Any, root_rank: int, **rest: Any) -> Any:
        own = per_rank_ids()
        return horovods([v for v in variables if id(v) not in own], root_rank, **rest)

    return broadcast_variables


def _targets() -> Iterator[Target]:
    if importlib.util.find_spec("horovod") is None:
        return
    from hvd_compress.keras.optimizer import DistributedOptimizer

    for name in ("horovod.tensorflow.keras", "horovod.keras"):
        try:
            module = importlib.import_module(name)
            callbacks = importlib.import_module(f"{name}.callbacks")
        except ImportError:
            continue
        yield module, {"DistributedOptimizer": DistributedOptimizer,
                       # the Keras that Horovod's module loads with (tf.keras, or Keras 3 for horovod.keras)
                       "load_model": Routed(_load_with(module.keras), _saved_with_ours, as_given=True)}
        yield callbacks, {"BroadcastGlobalVariablesCallback.on_train_begin": Extended(_broadcast_when_training_begins)}
    try:
        import horovod.tensorflow as hvd
    except ImportError:
        return
    yield hvd, {"join": join_first(getattr(hvd.join, "__hvdc_original__", hvd.join)),
                "broadcast_variables": Routed(_broadcast_but_per_rank(
                    getattr(hvd.broadcast_variables, "__hvdc_original__", hvd.broadcast_variables)),
                    _holds_per_rank, as_given=True)}


def install_from_environment() -> None:
    """At import of ``hvd_compress.keras``: route unless ``HVDC_HOROVOD_ENTRY=0`` or ``horovod_entry(False)``."""
    register("keras", _targets, _arguments)
