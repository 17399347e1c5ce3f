"""Ranks holding the same tensor on different device types: rank 1 passes a DLPack capsule whose device says
cuda:1 (a torch CPU tensor's capsule with its DLTensor device set by hand: no GPU needed), the others CPU tensors;
then every rank passes such a capsule. Each rank records what it got, and the allreduce after."""

import ctypes
import sys

import torch
from common import outcome, save

import hvd_compress.torch as hc
from hvd_compress.ops import collectives
from hvd_compress.ops.constants import ReduceOp

K_DL_CUDA = 2


def cuda_capsule(t: torch.Tensor, device_id: int):
    """``t``'s DLPack capsule claiming CUDA memory on ``device_id``. DLTensor starts with void* data, then
    DLDevice {int32 device_type, int32 device_id} (dlpack.h)."""
    cap = torch.utils.dlpack.to_dlpack(t)
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    p = get(cap, b"dltensor")
    ctypes.c_int32.from_address(p + 8).value = K_DL_CUDA
    ctypes.c_int32.from_address(p + 12).value = device_id
    return cap


hc.init()
r, n = hc.rank(), hc.size()
caught: dict[str, str] = {}
x = torch.full((5,), float(r + 1))
mixed = cuda_capsule(x, r) if r == 1 else x
caught["mixed"] = outcome(lambda: collectives.allreduce_(mixed, op=ReduceOp.Sum))
caught["mixed_unchanged"] = str(x.tolist())
every = cuda_capsule(torch.ones(3), 0)
caught["all"] = outcome(lambda: collectives.allreduce_(every, op=ReduceOp.Sum))
caught["recovered"] = str(hc.allreduce(torch.full((3,), float(r)), op=hc.Sum).tolist())
save(r, {"caught": caught, "argv": sys.argv[2:]})
