"""TensorFlow face of hvd_compress: ``import hvd_compress.tensorflow as hc``.

Use after ``hvd.init()`` (``horovod.tensorflow``), or ``hc.init()`` in a job without Horovod started by
``mpirun``. Every op works on TF tensors in eager mode and inside ``tf.function`` (not under XLA,
``jit_compile=True``). Keras optimizers: ``hvd_compress.keras``.
"""

from hvd_compress.algorithms import OPS as _ALGORITHM_OPS
from hvd_compress.ops.compression import Compression
from hvd_compress.ops.constants import (
    Adasum,
    Average,
    Max,
    Min,
    Product,
    ReduceOp,
    Sum,
)
from hvd_compress.ops.errors import (
    CommError,
    CommTimeoutError,
    LaunchError,
    MismatchError,
    NotInitializedError,
    NotInProcessSetError,
    PeerExitedError,
    ProcessSetError,
    RejectedInputError,
    UsageError,
)
from hvd_compress.ops.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from hvd_compress.ops.runtime import comm_stats, initialize_mpi_first, set_timeout
from hvd_compress.tensorflow.context import init, rank, size
from hvd_compress.tensorflow.functions import (
    CompressionState,
    OneBitState,
    allgather,
    allreduce,
    broadcast,
    broadcast_variables,
    compressed_allreduce,
    grouped_allreduce,
    join,
    masked_allreduce,
    random_mask,
)
from hvd_compress.tensorflow.gradient_tape import DistributedGradientTape

__all__ = [
    "Adasum",
    "Average",
    "Birder",
    "CommError",
    "CommTimeoutError",
    "Compression",
    "CompressionState",
    "DistributedGradientTape",
    "LaunchError",
    "Max",
    "Min",
    "MismatchError",
    "NotInProcessSetError",
    "NotInitializedError",
    "OneBitState",
    "PeerExitedError",
    "ProcessSet",
    "ProcessSetError",
    "Product",
    "ReduceOp",
    "RejectedInputError",
    "Sum",
    "UsageError",
    "add_process_set",
    "allgather",
    "allreduce",
    "broadcast",
    "broadcast_variables",
    "comm_stats",
    "compressed_allreduce",
    "global_process_set",
    "grouped_allreduce",
    "init",
    "join",
    "masked_allreduce",
    "random_mask",
    "rank",
    "remove_process_set",
    "set_timeout",
    "size",
]

# Every registered algorithm's ``op=`` constant as ``<face>.<name>`` (``algorithms.OPS``); a face class of that name
# (``Birder``, the optimizer) stays, and names its algorithm as ``op=`` through its ``hvdc_op``.
globals().update({name: op for name, op in _ALGORITHM_OPS.items() if name not in globals()})
__all__ += [name for name in _ALGORITHM_OPS if name not in __all__]

initialize_mpi_first()  # before hvd.init(): see hvd_compress.ops.runtime
