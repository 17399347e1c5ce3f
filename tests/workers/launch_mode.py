"""Under a Gloo-only horovodrun: hvd.init() works, hc must refuse with LaunchError on every rank, for
every op (Average and Adasum)."""

import horovod.torch as hvd
import torch
from common import save

import hvd_compress.torch as hc

hvd.init()
errors = {}
for op in (hc.Average, hc.Adasum):
    try:
        hc.allreduce(torch.ones(2), op=op)
        errors[op.name] = "no error"
    except Exception as e:  # the test inspects the type and text
        errors[op.name] = f"{type(e).__name__}: {e}"
save(hvd.rank(), {"errors": errors})
