"""Keras 3 face of hvd_compress: ``import hvd_compress.keras as hck``.

    opt = hck.DistributedOptimizer(keras.optimizers.Adam(1e-3), op=hck.OneBitAdam, freeze_step=100)
    model.compile(optimizer=opt, loss=..., jit_compile=False)
    model.fit(..., callbacks=[hck.callbacks.BroadcastGlobalVariablesCallback(0), hck.callbacks.MetricAverageCallback()])

Under mixed_float16 compile with ``hck.LossScaleOptimizer(hck.DistributedOptimizer(...))`` (an overflow on one rank
then skips the step on every rank). SLAMB: add ``hck.callbacks.SynchronizeParametersCallback()``.
"""

from hvd_compress.algorithms import OPS as _ALGORITHM_OPS
from hvd_compress.keras import callbacks
from hvd_compress.keras.birder import Birder
from hvd_compress.keras.horovod_entry import horovod_entry, install_from_environment
from hvd_compress.keras.loss_scale import LossScaleOptimizer
from hvd_compress.keras.optimizer import DistributedOptimizer
from hvd_compress.tensorflow import (
    Adasum,
    Average,
    CommError,
    CommTimeoutError,
    Compression,
    DistributedGradientTape,
    LaunchError,
    MismatchError,
    NotInitializedError,
    NotInProcessSetError,
    PeerExitedError,
    ProcessSetError,
    ReduceOp,
    RejectedInputError,
    Sum,
    UsageError,
    allreduce,
    broadcast_variables,
    global_process_set,
    init,
    join,
    rank,
    size,
)

__all__ = [
    "Adasum",
    "Average",
    "Birder",
    "CommError",
    "CommTimeoutError",
    "Compression",
    "DistributedGradientTape",
    "DistributedOptimizer",
    "LaunchError",
    "LossScaleOptimizer",
    "MismatchError",
    "NotInProcessSetError",
    "NotInitializedError",
    "PeerExitedError",
    "ProcessSetError",
    "ReduceOp",
    "RejectedInputError",
    "Sum",
    "UsageError",
    "allreduce",
    "broadcast_variables",
    "callbacks",
    "global_process_set",
    "horovod_entry",
    "init",
    "join",
    "rank",
    "size",
]

# Every registered algorithm's ``op=`` constant as ``<face>.<name>`` (``algorithms.OPS``); a face class of that name
# (``Birder``, the optimizer) stays, and names its algorithm as ``op=`` through its ``hvdc_op``.
globals().update({name: op for name, op in _ALGORITHM_OPS.items() if name not in globals()})
__all__ += [name for name in _ALGORITHM_OPS if name not in __all__]

install_from_environment()
