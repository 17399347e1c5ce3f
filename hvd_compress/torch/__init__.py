"""PyTorch face of hvd_compress: ``import hvd_compress.torch as hc``.

Use after ``hvd.init()`` (or ``hc.init()`` in a job without Horovod, started by ``mpirun``)::

    opt = hc.DistributedOptimizer(opt, named_parameters=model.named_parameters(), op=hc.Average)
"""

from hvd_compress.algorithms import OPS as _ALGORITHM_OPS
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
    PerRankStateWarning,
    ProcessSetError,
    RejectedInputError,
    UsageError,
)
from hvd_compress.ops.process_sets import ProcessSet, add_process_set, global_process_set, remove_process_set
from hvd_compress.ops.runtime import comm_stats, initialize_mpi_first, set_timeout
from hvd_compress.torch.asynchronous import (
    allgather_async,
    allreduce_async,
    allreduce_async_,
    broadcast_async,
    broadcast_async_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    poll,
    synchronize,
)
from hvd_compress.torch.birder import Birder
from hvd_compress.torch.checkpoint import full_optimizer_state_dict
from hvd_compress.torch.compression import Compression, CompressionState, Compressor
from hvd_compress.torch.context import init, rank, size
from hvd_compress.torch.functions import (
    allreduce,
    allreduce_,
    broadcast,
    broadcast_,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
    join,
)
from hvd_compress.torch.gather import allgather, allgather_object
from hvd_compress.torch.grouped import grouped_allreduce, grouped_allreduce_
from hvd_compress.torch.horovod_entry import horovod_entry, install_from_environment
from hvd_compress.torch.lamb import Lamb
from hvd_compress.torch.masked import masked_allreduce, masked_allreduce_, random_mask
from hvd_compress.torch.onebit import OneBitState, compressed_allreduce, compressed_allreduce_
from hvd_compress.torch.optimizer import DistributedOptimizer

__all__ = [
    "Adasum",
    "Average",
    "Birder",
    "CommError",
    "CommTimeoutError",
    "Compression",
    "CompressionState",
    "Compressor",
    "DistributedOptimizer",
    "Lamb",
    "LaunchError",
    "Max",
    "Min",
    "MismatchError",
    "NotInProcessSetError",
    "NotInitializedError",
    "OneBitState",
    "PeerExitedError",
    "PerRankStateWarning",
    "ProcessSet",
    "ProcessSetError",
    "Product",
    "ReduceOp",
    "RejectedInputError",
    "Sum",
    "UsageError",
    "add_process_set",
    "allgather",
    "allgather_async",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "comm_stats",
    "compressed_allreduce",
    "compressed_allreduce_",
    "full_optimizer_state_dict",
    "global_process_set",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "horovod_entry",
    "init",
    "join",
    "masked_allreduce",
    "masked_allreduce_",
    "poll",
    "random_mask",
    "rank",
    "remove_process_set",
    "set_timeout",
    "size",
    "synchronize",
]

# Every registered algorithm's ``op=`` constant as ``<face>.<name>`` (``algorithms.OPS``); a face class of that name
# (``Birder``, the optimizer) stays, and names its algorithm as ``op=`` through its ``hvdc_op``.
globals().update({name: op for name, op in _ALGORITHM_OPS.items() if name not in globals()})
__all__ += [name for name in _ALGORITHM_OPS if name not in __all__]

install_from_environment()

initialize_mpi_first()  # before hvd.init(): see hvd_compress.ops.runtime
