"""Adasum cases on real ranks: every (dtype, size), grouped, special inputs, hierarchical, errors, stats.

Inputs are re-created by the test from (rank, numel, dtype, seed) with common.rank_input; the worker
saves only outputs (in their own dtype) and, for hand-made inputs, the inputs too.
"""

import os
import sys

import torch
from common import DTYPES, rank_input, save

import hvd_compress.torch as hc
from hvd_compress import ops
from hvd_compress.torch.grouped import grouped_allreduce, grouped_allreduce_

hc.init()
r, n = hc.rank(), hc.size()
sizes = [int(s) for s in sys.argv[2].split(",")]
GROUP = [5, 0, 4097, 1, 300]  # tensor sizes of the grouped cases (a zero-size tensor included)
out: dict = {"single": {}, "grouped": {}, "fused": {}, "hier": {}, "special": {}, "caught": {}}


def attempt(label, fn):
    try:
        fn()
    except Exception as e:  # the test inspects the type and text
        out["caught"][label] = f"{type(e).__name__}: {e}"
    else:
        out["caught"][label] = "no error"


for dname, dtype in DTYPES.items():
    for numel in sizes:
        x = rank_input(r, numel, dtype, seed=numel)
        y = hc.allreduce(x, op=hc.Adasum, name=f"adasum.{dname}.{numel}")
        assert y.dtype == dtype and y.shape == x.shape
        out["single"][(dname, numel)] = y
    xs = [rank_input(r, k, dtype, seed=100 + i) for i, k in enumerate(GROUP)]
    ys = grouped_allreduce(xs, op=hc.Adasum, name=f"group.{dname}")
    out["grouped"][dname] = ys
    # The same tensors as one caller-fused buffer with sizes: must give the same bits.
    flat = torch.cat(xs)
    ops.adasum_fused_(flat, GROUP, name=f"fused.{dname}")
    out["fused"][dname] = flat
    # Hierarchical (HVDC_LOCAL_SIZE set by the test): by argument, and by environment variable.
    h = torch.cat(xs)
    ops.adasum_fused_(h, GROUP, hierarchical=True)
    # The variable is read once, at init: a fresh runtime with it set, then one without.
    os.environ["HVDC_ADASUM_HIERARCHICAL"] = "1"
    ops.shutdown()
    hc.init()
    h_env = grouped_allreduce([x.clone() for x in xs], op=hc.Adasum)
    del os.environ["HVDC_ADASUM_HIERARCHICAL"]
    ops.shutdown()
    hc.init()
    out["hier"][dname] = (h, torch.cat(h_env))

# Special inputs, float32 and float64, one group each: orthogonal, identical, zero, partly zero, NaN.
for dname in ("float32", "float64"):
    dtype = DTYPES[dname]
    ortho = torch.zeros(4 * n + 3, dtype=dtype)
    ortho[r * 4 : r * 4 + 4] = rank_input(r, 4, dtype, seed=7)  # disjoint supports: <g_i, g_j> = 0
    same = rank_input(0, 33, dtype, seed=8)  # identical on every rank
    zero = torch.zeros(9, dtype=dtype)
    half_zero = torch.zeros(9, dtype=dtype) if r == 0 else rank_input(r, 9, dtype, seed=9)
    nan = rank_input(r, 17, dtype, seed=10)
    if r == 0:
        nan[3] = float("nan")
    tail = rank_input(r, 11, dtype, seed=11)  # after the NaN tensor: must stay finite
    inputs = [ortho, same, zero, half_zero, nan, tail]
    out["special"][dname] = ([t.clone() for t in inputs], grouped_allreduce_(inputs, op=hc.Adasum))

# In-place face on a non-contiguous tensor keeps its layout.
base = rank_input(r, 64, torch.float32, seed=12).view(8, 8)
t = base.t()
hc.allreduce_(t, op=hc.Adasum)
out["noncontig"] = t.contiguous()

# Errors: every rank raises, then the ranks keep working.
attempt("numel", lambda: hc.allreduce(torch.ones(4 + r), op=hc.Adasum))
attempt("count", lambda: grouped_allreduce([torch.ones(8)] if r == 0 else [torch.ones(4), torch.ones(4)], op=hc.Adasum))
attempt("layout", lambda: ops.adasum_fused_(torch.ones(8), [3, 5] if r == n - 1 else [4, 4]))
attempt("mode", lambda: ops.adasum_fused_(torch.ones(8), [8], hierarchical=(r == 0)))
attempt("bad_sizes", lambda: ops.adasum_fused_(torch.ones(8), [4, 5] if r == n - 1 else [4, 4]))
attempt("mixed_dtypes", lambda: grouped_allreduce([torch.ones(2), torch.ones(2, dtype=torch.float64)], op=hc.Adasum))
attempt("int_dtype", lambda: hc.allreduce(torch.ones(4, dtype=torch.int32 if r == 0 else torch.float32), op=hc.Adasum))
out["recovered"] = hc.allreduce(torch.full((3,), float(r + 1)), op=hc.Adasum)

# Bytes on the wire of one call (float32, 1 << 12 elements).
hc.comm_stats(reset=True)
hc.allreduce(rank_input(r, 4096, torch.float32, seed=13), op=hc.Adasum)
out["stats"] = hc.comm_stats(reset=True)
save(r, out)
