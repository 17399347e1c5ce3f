"""Clipping with every compressed op is never ignored (2, 3 and 4 ranks, real processes). Horovod's pattern: with
overlap, where the compressed stage had consumed the gradients in ``synchronize()``, ``step()`` honours an edit of
``.grad`` and ends bit-identical to the same run with ``overlap=False`` (which clips before any reduction); the
clip changes the result; one rank clipping alone is honoured on every rank alike. DDP's (clipping between
``backward()`` and ``step()``, no ``synchronize()``): the buckets started during backward consumed the gradients
too, and ``step()`` finds the edit alike, bit-identical to Horovod's pattern (a warm-up's averages are clipped
after backward, as DDP's). Adasum, whose local steps have consumed the gradients, refuses the edit on every rank
with a clear error. A 1-bit warm-up, op=Average or op=PowerSGD with a bucket held back by a parameter without a
gradient refuses DDP's clip on every rank, also one rank's alone; ``backward()`` returns a warm-up's averaged
gradients, as DDP's."""

from __future__ import annotations

import numpy as np
import pytest
from mpi_harness import load_ranks, mpirun

HONOURED = ["OneBitAdam", "OneBitLamb", "Birder", "SLAMB", "ZeroOneAdam"]


@pytest.mark.parametrize("n", [2, 3, pytest.param(4, marks=pytest.mark.long)])
def test_clipping_is_honoured_or_refused_on_every_rank(n: int, out_dir) -> None:
    mpirun("clipping.py", n, out_dir, ",".join([*HONOURED, "Adasum", "Average", "PowerSGD"]), timeout=400)
    ranks = load_ranks(out_dir, n)
    for op in HONOURED:
        for mode in ("plain", "clip", "clip_nooverlap", "clip_one_rank", "clip_ddp", "clip_ddp_one_rank"):
            got = {r[(op, mode)] for r in ranks}
            assert len(got) == 1, f"{op} {mode}: ranks differ at n={n}: {[r[(op, mode)] for r in ranks]}"
            assert all(len(h) == 64 for h in got), f"{op} {mode} raised at n={n}: {got}"
        for r, rk in enumerate(ranks):
            assert rk[(op, "clip_ddp")] == rk[(op, "clip")], f"{op} rank {r}: DDP's clipping under overlap ignored"
            assert rk[(op, "clip_ddp_one_rank")] == rk[(op, "clip_one_rank")], f"{op} rank {r}: one rank's DDP clip"
    # A warm-up and op=Average average in place: with a bucket held back by a parameter without a gradient, DDP's
    # clip after backward() saw averaged and local gradients alike (the ranks would step apart): refused on every
    # rank, also where one rank alone clipped (the others raise the rejection that names its reason).
    for op in ("OneBitAdam", "Average", "PowerSGD"):
        for r, rk in enumerate(ranks):
            got = rk[(op, "held_back_ddp")]
            assert got.startswith("UsageError") and "opt.synchronize() before" in got and f"op={op})" in got, \
                f"{op} rank {r}: {got}"
            got = rk[(op, "held_back_ddp_one_rank")]
            assert got.startswith("UsageError" if r == 0 else ("UsageError", "RejectedInputError")) and \
                "opt.synchronize() before" in got, f"{op} rank {r} of {n}, rank 0 clipping alone: {got}"
        got = {rk[(op, "held_back_pattern")] for rk in ranks}
        assert len(got) == 1 and len(next(iter(got))) == 64, f"{op} held back, Horovod's pattern: {got}"
    # backward() returns a warm-up's averages (its buckets waited for), as DDP's: what code after it reads and
    # clips; the hooks' reductions would otherwise still be writing them.
    mean = np.mean([rk[("OneBitAdam", "after_backward")][0] for rk in ranks], axis=0, dtype=np.float64)
    for r, rk in enumerate(ranks):
        got = rk[("OneBitAdam", "after_backward")][1]
        off = int(np.sum(~np.isclose(got, mean, rtol=1e-5, atol=1e-8)))
        assert off == 0, f"rank {r} of {n}: .grad after backward() is not the average in {off} of {got.size} elements"
    for op in HONOURED:
        r0 = ranks[0]
        assert r0[(op, "clip")] == r0[(op, "clip_nooverlap")], f"{op}: the clip under overlap was not honoured"
        assert r0[(op, "clip")] != r0[(op, "plain")], f"{op}: clipping changed nothing (test too weak)"
        assert r0[(op, "clip_one_rank")] not in (r0[(op, "plain")], r0[(op, "clip")]), f"{op}: one rank's clip"
    for mode, since in (("clip", "synchronize()"), ("clip_one_rank", "synchronize()"), ("clip_ddp", "backward()"),
                        ("clip_ddp_one_rank", "backward()")):
        for r, rk in enumerate(ranks):
            assert rk[("Adasum", mode)].startswith("UsageError") and f"{since} and step()" in \
                rk[("Adasum", mode)], f"Adasum {mode} rank {r}: {rk[('Adasum', mode)]}"
    assert len(ranks[0][("Adasum", "plain")]) == 64, ranks[0][("Adasum", "plain")]
