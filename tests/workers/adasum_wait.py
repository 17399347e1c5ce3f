"""Adasum when ranks arrive late, on buffers whose length exercises the vector kernels' tails.

Rank r sleeps 30 ms * r before each first call, so the waiting ranks go past the spin-and-yield
phase of the core's waits (5 ms) into the sleeping one; the second call on the same input follows at
once. Sizes: around multiples of the 8 summation lanes, and one large buffer (16 MiB of float32)
that travels as large point-to-point messages. Saves both results per (dtype, numel).
"""

import sys
import time

from common import DTYPES, rank_input, save

import hvd_compress.torch as hc

hc.init()
r = hc.rank()
sizes = [int(s) for s in sys.argv[2].split(",")]
out: dict = {}
for dname in ("float32", "float64"):
    for numel in sizes:
        x = rank_input(r, numel, DTYPES[dname], seed=numel + 1)
        time.sleep(0.03 * r)
        late = hc.allreduce(x, op=hc.Adasum, name=f"late.{dname}.{numel}")
        again = hc.allreduce(x, op=hc.Adasum, name=f"again.{dname}.{numel}")
        out[(dname, numel)] = (late, again)
save(r, out)
