"""Inputs and expected outputs of the C++ collective tests (cpp/tests), computed by the NumPy reference.

``python3 cpp/tests/make_fixtures.py OUT`` writes OUT in the format read by cpp/tests/fixtures.h: the magic
``HVDCFIX1``, then per array a uint32 name length, the name, a uint64 count and that many little-endian
float64 values. ``make cpptest`` runs it at test time into build/cpptest/ rather than committing its output:
the C++ is then always compared with the reference as it is in this checkout (a committed file could go stale
when the reference changes), the repository carries no binary blobs (the file is several MB), and it takes
about a second.

Cases (the C++ tests find them through each case's ``meta`` array, so the list lives here only):

- ``adasum/<case>``: ``hvd_compress.reference.adasum`` (or ``adasum_hierarchical``) at n = 1..5 ranks, every
  storage dtype, one tensor of 0, 1, 7 or 4097 elements, the grouped layout of tests/test_adasum.py (per-tensor
  coefficients), a zero vector on one rank, and hierarchical mode with nodes of 2 ranks. meta = [n, dtype code,
  local size (0: flat), tensor sizes...]; ``in/<r>`` rank r's input; ``out`` every rank's expected result;
  ``tol`` the element-wise tolerance that tests/test_adasum.py uses too (reference.adasum.core_tolerance).
- ``onebit/<case>``: ``hvd_compress.reference.onebit.compressed_allreduce`` at n = 1..5 for float32, float16
  and bfloat16 buffers of 1, 13, 1000, 2400 and 4099 elements, three calls in a row with the errors carried
  over. meta = [n, dtype code, numel, calls]; ``<call>/in/<r>``, ``<call>/out``, ``<call>/werr/<r>`` and
  ``<call>/serr/<r>`` (worker and server error after the call).
- ``hierarchical/<case>``: ``hvd_compress.reference.birder`` (``hierarchical_1bit_allreduce`` for Birder's +/-1
  payload, ``hierarchical_scaled_allreduce`` for the scaled 1-bit one) at 2 nodes x 2 ranks, 1 node x 3 and
  3 x 1 (nodes of one rank, and flat mode without a node group), buffers of 1, 13, 96 (no padding) and 1029
  elements, three calls in a row with the errors (and moments) carried over; the +/-1 payload with injected
  uniforms, with injected uniforms and Birder's moments, and with the core's Philox draws and moments. meta =
  [world, ranks per node, flat (0/1), numel, calls, payload (1: +/-1, 2: scaled), moments (0/1), injected
  (0/1), seed]; per call (the Philox step is the call index) ``<call>/in/<r>``, ``<call>/uw`` (nodes x padded
  numel) and ``<call>/us`` (padded numel) when injected, ``<call>/out``, ``<call>/werr/<r>`` (c1 entries),
  ``<call>/serr/<r>`` (c2) and, with moments, ``<call>/m/<r>`` and ``<call>/b/<r>`` (c1).
"""

from __future__ import annotations

import os
import struct
import sys
from typing import BinaryIO

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from hvd_compress import reference
from hvd_compress.reference import birder, onebit
from hvd_compress.reference.adasum import combine_steps, core_tolerance

# hvdc::DType (cpp/include/hvdc/dtype.h)
DTYPE_CODES = {"float16": 0, "bfloat16": 1, "float32": 2, "float64": 3}
RANKS = range(1, 6)
ADASUM_SIZES = [[0], [1], [7], [4097]]
GROUP = [5, 0, 4097, 1, 300]  # tests/test_adasum.py's grouped layout
LOCAL_SIZE = 2  # nodes {0, 1}, {2, 3}, {4} in hierarchical mode, as tests/test_adasum.py
ONEBIT_SIZES = [1, 13, 1000, 2400, 4099]  # 2400 is a multiple of 8 * n for n = 1..5 (no padding); others pad
ONEBIT_CALLS = 3
# (world, ranks per node, flat): 2 nodes x 2 ranks, 1 node x 3, 3 nodes x 1 (a node group of one rank, and flat)
HIERARCHICAL_TOPOLOGIES = [(4, 2, 0), (3, 3, 0), (3, 1, 0), (3, 1, 1)]
HIERARCHICAL_SIZES = [1, 13, 96, 1029]  # 96: a multiple of 8 * world (no padding) at world 3 and 4
# (name, payload, moments, injected uniforms)
HIERARCHICAL_MODES = [("sign", 1, 0, 1), ("sign-moments", 1, 1, 1), ("philox-moments", 1, 1, 0), ("scaled", 2, 0, 0)]
HIERARCHICAL_CALLS = 3
HIERARCHICAL_SEED = 1234


class Writer:
    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.out.write(b"HVDCFIX1")

    def array(self, name: str, values: np.ndarray | list[float]) -> None:
        data = np.ascontiguousarray(np.asarray(values, dtype="<f8").ravel())
        key = name.encode()
        self.out.write(struct.pack("<I", len(key)) + key + struct.pack("<Q", data.size) + data.tobytes())


def rank_inputs(n: int, numel: int, dtype: str, seed: int) -> list[np.ndarray]:
    """Rank r's vector: normal values with a rank-dependent scale, rounded to ``dtype``."""
    rng = np.random.default_rng(seed)
    return [reference.round_to(rng.standard_normal(numel) * (1 + 0.5 * r), dtype) for r in range(n)]


def write_adasum_case(w: Writer, name: str, inputs: list[np.ndarray], sizes: list[int], dtype: str, local: int) -> None:
    n = len(inputs)
    if local:
        want = reference.adasum_hierarchical(inputs, local, sizes=sizes, dtype=dtype)
        steps = combine_steps(-(-n // local)) + 1  # the node average is one more rounding
    else:
        want = reference.adasum(inputs, sizes=sizes, dtype=dtype)
        steps = combine_steps(n)
    base = f"adasum/{name}"
    w.array(f"{base}/meta", [n, DTYPE_CODES[dtype], local, *sizes])
    for r, x in enumerate(inputs):
        w.array(f"{base}/in/{r}", x)
    assert all(np.array_equal(v, want[0], equal_nan=True) for v in want), "reference ranks differ"
    w.array(f"{base}/out", want[0])
    w.array(f"{base}/tol", core_tolerance(inputs, dtype, steps) if sum(sizes) else [])


def write_adasum(w: Writer) -> None:
    for n in RANKS:
        for dtype in DTYPE_CODES:
            for sizes in [*ADASUM_SIZES, GROUP]:
                inputs = rank_inputs(n, sum(sizes), dtype, seed=sum(sizes))
                write_adasum_case(w, f"n{n}-{dtype}-{'-'.join(map(str, sizes))}", inputs, sizes, dtype, 0)
            # A zero vector on the last rank: its coefficient is 1 (norm^2 below sqrt(DBL_MIN)).
            inputs = rank_inputs(n, 300, dtype, seed=7)
            inputs[-1][:] = 0.0
            write_adasum_case(w, f"n{n}-{dtype}-zero", inputs, [300], dtype, 0)
            inputs = rank_inputs(n, sum(GROUP), dtype, seed=11)
            write_adasum_case(w, f"n{n}-{dtype}-hierarchical", inputs, GROUP, dtype, LOCAL_SIZE)


def write_onebit(w: Writer) -> None:
    for n in RANKS:
        for dtype in onebit.SUPPORTED:
            for numel in ONEBIT_SIZES:
                base = f"onebit/n{n}-{dtype}-{numel}"
                w.array(f"{base}/meta", [n, DTYPE_CODES[dtype], numel, ONEBIT_CALLS])
                werr = [np.zeros(numel) for _ in range(n)]
                serr = [np.zeros(onebit.padded_numel(numel, n) // n) for _ in range(n)]
                for call in range(ONEBIT_CALLS):
                    inputs = rank_inputs(n, numel, dtype, seed=100 * call + numel)
                    outs, werr, serr = onebit.compressed_allreduce(inputs, werr, serr, dtype)
                    for r in range(n):
                        w.array(f"{base}/{call}/in/{r}", inputs[r])
                        w.array(f"{base}/{call}/werr/{r}", werr[r])
                        w.array(f"{base}/{call}/serr/{r}", serr[r])
                    w.array(f"{base}/{call}/out", outs[0])


def write_hierarchical(w: Writer) -> None:
    for world, m_loc, flat in HIERARCHICAL_TOPOLOGIES:
        n_nodes = world // m_loc
        topo = "flat" if flat else f"{n_nodes}x{m_loc}"
        for mode, payload, with_moments, injected in HIERARCHICAL_MODES:
            for numel in HIERARCHICAL_SIZES:
                base = f"hierarchical/n{world}-{topo}-{mode}-{numel}"
                w.array(f"{base}/meta", [world, m_loc, flat, numel, HIERARCHICAL_CALLS, payload, with_moments,
                                         injected, HIERARCHICAL_SEED])
                dpad = birder.padded_numel(numel, world)
                c1, c2 = dpad // m_loc, dpad // world
                # float32 state for the +/-1 payload (the reference rounds as the core); float64 values of
                # float32 for the scaled one (reference.onebit's convention)
                state = np.float32 if payload == 1 else np.float64
                werr = [np.zeros(c1, state) for _ in range(world)]
                serr = [np.zeros(c2, state) for _ in range(world)]
                moments = None
                if with_moments:
                    moments = [birder.Moments(np.zeros(c1, np.float32), np.zeros(c1, np.float32)) for _ in range(world)]
                rng = np.random.default_rng([world, m_loc, numel, payload])
                for call in range(HIERARCHICAL_CALLS):
                    xs = np.stack(rank_inputs(world, numel, "float32", seed=100 * call + numel)).astype(np.float32)
                    if payload == 2:
                        out = birder.hierarchical_scaled_allreduce(xs, werr, serr, m_loc)
                    else:
                        if injected:
                            uniforms = (rng.random((n_nodes, dpad), dtype=np.float32),
                                        rng.random(dpad, dtype=np.float32))
                            w.array(f"{base}/{call}/uw", uniforms[0])
                            w.array(f"{base}/{call}/us", uniforms[1])
                        else:
                            uniforms = birder.draw_uniforms(HIERARCHICAL_SEED, call, n_nodes, dpad)
                        out = birder.hierarchical_1bit_allreduce(xs, werr, serr, m_loc, uniforms, moments)
                    w.array(f"{base}/{call}/out", out)
                    for r in range(world):
                        w.array(f"{base}/{call}/in/{r}", xs[r])
                        w.array(f"{base}/{call}/werr/{r}", werr[r])
                        w.array(f"{base}/{call}/serr/{r}", serr[r])
                        if moments is not None:
                            w.array(f"{base}/{call}/m/{r}", moments[r].m)
                            w.array(f"{base}/{call}/b/{r}", moments[r].b)


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: make_fixtures.py OUT")
    tmp = sys.argv[1] + ".tmp"
    with open(tmp, "wb") as out:
        w = Writer(out)
        write_adasum(w)
        write_onebit(w)
        write_hierarchical(w)
    os.replace(tmp, sys.argv[1])  # a half-written file never passes for a finished one


if __name__ == "__main__":
    main()
