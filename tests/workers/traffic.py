"""Per-call byte counts: a meter counts its own calls only, while another thread communicates in between."""

import threading

import torch
from common import save

import hvd_compress.torch as hc
from hvd_compress import ops
from hvd_compress.ops.traffic import CommMeter

hc.init()
r = hc.rank()
hc.comm_stats(reset=True)
other = ops.Traffic()


def other_thread() -> None:
    # Not the meter's: a larger allreduce on another thread, while the meter's run() is in progress.
    with ops.counting(other):
        hc.allreduce(torch.ones(1 << 16), name="other")


def metered() -> None:
    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    hc.allreduce(torch.ones(1000), name="mine")


meter = CommMeter()
meter.run(metered)
alone = ops.Traffic()
ops.allreduce_(torch.ones(1000), name="mine", traffic=alone)
save(r, {"meter": meter.take(), "alone": alone.take(), "other": other.take(), "total": hc.comm_stats()})
