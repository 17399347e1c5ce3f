"""Under a Gloo-only horovodrun: hvd.init() works, hc must refuse with LaunchError on every rank."""

import horovod.torch as hvd
import torch
from common import save

import hvd_compress.torch as hc

hvd.init()
try:
    hc.allreduce(torch.ones(2))
    error = "no error"
except Exception as e:
    error = f"{type(e).__name__}: {e}"
save(hvd.rank(), {"error": error})
