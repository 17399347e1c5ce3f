"""Framework-neutral API of hvd_compress (layer 2 of DESIGN.md): ops, runtime, collectives."""

from hvd_compress.ops.collectives import (
    adasum_fused_,
    allgather,
    allreduce_,
    broadcast_,
    grouped_allreduce_,
    join,
    reject_allreduce,
)
from hvd_compress.ops.compression import Compression, CompressionState, Compressor
from hvd_compress.ops.constants import Adasum, AlgorithmOp, Average, Max, Min, Product, ReduceOp, Sum
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
from hvd_compress.ops.runtime import Config, comm_stats, init, is_initialized, rank, set_timeout, shutdown, size
from hvd_compress.ops.traffic import Traffic, counting

__all__ = [
    "Adasum",
    "AlgorithmOp",
    "Average",
    "CommError",
    "CommTimeoutError",
    "Compression",
    "CompressionState",
    "Compressor",
    "Config",
    "LaunchError",
    "Max",
    "Min",
    "MismatchError",
    "NotInProcessSetError",
    "NotInitializedError",
    "PeerExitedError",
    "ProcessSetError",
    "Product",
    "ReduceOp",
    "RejectedInputError",
    "Sum",
    "Traffic",
    "UsageError",
    "adasum_fused_",
    "allgather",
    "allreduce_",
    "broadcast_",
    "comm_stats",
    "counting",
    "grouped_allreduce_",
    "init",
    "is_initialized",
    "join",
    "rank",
    "reject_allreduce",
    "set_timeout",
    "shutdown",
    "size",
]
