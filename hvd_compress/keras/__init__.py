"""Keras 3 face of hvd_compress: ``import hvd_compress.keras as hck``.

    opt = hck.DistributedOptimizer(keras.optimizers.Adam(1e-3), op=hck.OneBitAdam, freeze_step=100)
    model.compile(optimizer=opt, loss=..., jit_compile=False)
    model.fit(..., callbacks=[hck.callbacks.BroadcastGlobalVariablesCallback(0), hck.callbacks.MetricAverageCallback()])

Under mixed_float16 compile with ``hck.LossScaleOptimizer(hck.DistributedOptimizer(...))`` (an overflow on one rank
then skips the step on every rank). SLAMB: add ``hck.callbacks.SynchronizeParametersCallback()``.
"""

from hvd_compress.keras import callbacks
from hvd_compress.keras.birder import Birder
from hvd_compress.keras.horovod_entry import horovod_entry, install_from_environment
from hvd_compress.keras.loss_scale import LossScaleOptimizer
from hvd_compress.keras.optimizer import DistributedOptimizer
from hvd_compress.tensorflow import (
    SLAMB,
    Adasum,
    Average,
    Compression,
    OneBitAdam,
    OneBitLamb,
    ReduceOp,
    Sum,
    UsageError,
    ZeroOneAdam,
    allreduce,
    broadcast_variables,
    global_process_set,
    init,
    rank,
    size,
)

__all__ = [
    "SLAMB",
    "Adasum",
    "Average",
    "Birder",
    "Compression",
    "DistributedOptimizer",
    "LossScaleOptimizer",
    "OneBitAdam",
    "OneBitLamb",
    "ReduceOp",
    "Sum",
    "UsageError",
    "ZeroOneAdam",
    "allreduce",
    "broadcast_variables",
    "callbacks",
    "global_process_set",
    "horovod_entry",
    "init",
    "rank",
    "size",
]

install_from_environment()
