"""hc.random_mask and hc.masked_allreduce (SLAMB's communication; spec shared/specs/slamb.md sections 2 and 3)
on real MPI processes against the NumPy mirror hvd_compress.reference.masks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from mpi_harness import load_ranks, mpirun
from workers.common import rank_input

import hvd_compress.torch as hc
from hvd_compress import _core
from hvd_compress.ops import masks as mask_ops
from hvd_compress.reference import masks as ref

SEED = 1234


@pytest.mark.parametrize("kind", ["cyclic", "bernoulli"])
@pytest.mark.parametrize(("numel", "ratio"), [(1, 0.5), (1000, 0.1), (4099, 0.25), (777, 1.0), (50, 0.01)])
def test_random_mask_equals_reference(numel: int, ratio: float, kind: str) -> None:
    for step in (0, 1, 2, 7, 2**32 + 3):
        got = hc.random_mask(numel, ratio, SEED, step, kind).numpy()
        want = ref.random_mask(numel, ratio, SEED, step, kind)
        assert np.array_equal(got, want), f"{kind} numel={numel} k={ratio} step={step}: {np.sum(got != want)} differ"


@pytest.mark.parametrize("kind", ["cyclic", "bernoulli"])
def test_a_range_of_a_mask_is_that_slice_of_the_whole_mask(kind: str) -> None:
    """SLAMB's buckets draw M_t for their range of D only (``ops.masks`` ``offset``/``total``): each bit is the one
    it has in the whole mask, always-selected ranges that cross the cut included; a range past the end raises."""
    numel, always = 5003, [0, 7, 1990, 30, 4000, 1003]
    for step in (1, 2, 9):
        want = ref.random_mask(numel, 0.25, SEED, step, kind, always)
        for lo, hi in ((0, 1), (0, 2000), (2000, 2001), (1995, 4100), (4100, numel)):
            got = mask_ops.random_mask_(torch.zeros(hi - lo, dtype=torch.bool), 0.25, SEED, step, kind, always,
                                        offset=lo, total=numel).numpy()
            assert np.array_equal(got, want[lo:hi]), f"{kind} step {step} [{lo}, {hi}): {np.sum(got != want[lo:hi])}"
    with pytest.raises(ValueError, match="outside"):
        mask_ops.random_mask_(torch.zeros(10, dtype=torch.bool), 0.25, SEED, 1, kind, offset=numel - 5, total=numel)


def _tie_ratio(h: int, tl: int) -> float:
    """The ratio whose T is (h << 16 | tl): with tl's low 8 bits zero T has at most 24 significant bits, so T / 2^32
    is a float32 and float32(ratio) is exact."""
    return ((h << 16) | tl) / 2.0**32


@pytest.mark.parametrize(("numel", "seed", "step", "first"), [(9000, 1234, 3, 0), (9000, 2**64 - 1, 2**32 + 5, 4097),
                                                             (20_000, 77, 0, 1), (6000, 5, 11, 2**34 + 3)])
def test_bernoulli_mask_equals_reference_at_any_start_with_ties(numel: int, seed: int, step: int, first: int) -> None:
    """The core's Bernoulli draw (16-bit halves of two Philox streams, the tie stream read only where hi == T >> 16)
    equals the NumPy mirror, which draws both streams whole, element by element, for ranges starting anywhere in a
    mask of first + numel elements; the tie ratios make elements of the range tie, and the ties go both ways."""
    hi = ref.bernoulli_halves(numel, seed, step, ref.BERNOULLI_STREAM, first)
    lo = ref.bernoulli_halves(numel, seed, step, ref.BERNOULLI_TIE_STREAM, first)
    tie_ratios = [_tie_ratio(int(hi[x]), tl) for x in (0, 1, 2, 3, 500, numel - 1) for tl in (0x8000, 0x1200)]
    ties = {True: 0, False: 0}
    for ratio in [1.0, 0.5, 0.1, 1e-7, 0.999999, *tie_ratios]:
        t = ref.bernoulli_threshold(ratio)
        want = ref.bernoulli_mask(numel, ratio, seed, step, first)
        tied = (hi == t >> 16) & ((t & 0xFFFF) != 0) & (t < 2**32)
        for taken in (True, False):
            ties[taken] += int(np.sum(tied & ((lo < (t & 0xFFFF)) == taken)))
        for lo_cut, hi_cut in ((0, numel), (1, numel - 1), (63, 4160), (4095, 4097)):
            got = np.zeros(hi_cut - lo_cut, dtype=bool)
            _core.random_mask(got, ratio, seed, step, 1, [], first + lo_cut, first + numel)
            diff = np.flatnonzero(got != want[lo_cut:hi_cut])
            assert diff.size == 0, (f"k={ratio} seed={seed} step={step} range [{first + lo_cut}, {first + hi_cut}): "
                                    f"{diff.size} differ, first at {first + lo_cut + diff[0]}")
    assert ties[True] > 0 and ties[False] > 0, ties


@pytest.mark.parametrize("ratio", [0.1, 0.5, 1e-5, 0.999])
def test_bernoulli_mask_selects_t_over_2_32_of_the_elements(ratio: float) -> None:
    """Each element with probability T / 2^32 (T = ceil(float32(k) 2^32)): the count of a 4M-element mask lies
    within 5 standard deviations of its mean."""
    numel = 1 << 22
    p = ref.bernoulli_threshold(ratio) / 2.0**32
    mask = np.zeros(numel, dtype=bool)
    _core.random_mask(mask, ratio, 99, 4, 1, [])
    mean, sd = numel * p, math.sqrt(numel * p * (1 - p))
    assert abs(int(mask.sum()) - mean) < 5 * sd, f"k={ratio}: {int(mask.sum())} selected, mean {mean:.1f} sd {sd:.1f}"


def test_cyclic_mask_selects_every_element_once_per_cycle() -> None:
    numel, ratio = 1003, 0.1
    hits = sum(hc.random_mask(numel, ratio, 5, t).long() for t in range(3, 13))
    assert torch.equal(hits, torch.ones(numel, dtype=torch.long))
    counts = {int(hc.random_mask(numel, ratio, 5, t).sum()) for t in range(10)}
    assert counts == {101, 94}, counts  # ceil(1003 / 10) per chunk, the last chunk the rest


def test_random_mask_rejects_bad_arguments() -> None:
    for kwargs in ({"ratio": 0.0}, {"ratio": 1.5}, {"ratio": -0.1}, {"seed": -1}, {"step": -1}, {"kind": "x"}):
        args = {"numel": 10, "ratio": 0.5, "seed": 1, "step": 1, "kind": "cyclic", **kwargs}
        with pytest.raises(ValueError):
            hc.random_mask(**args)


@pytest.mark.parametrize(("n", "numel", "ratio", "kind"), [(2, 1000, 0.1, "cyclic"), (3, 4099, 0.25, "bernoulli"),
                                                          (4, 517, 0.1, "cyclic")])
def test_masked_allreduce_matches_reference_on_every_rank(n: int, numel: int, ratio: float, kind: str,
                                                          out_dir) -> None:
    steps = 4
    mpirun("masked.py", n, out_dir, str(numel), str(ratio), kind, str(steps), timeout=120)
    ranks = load_ranks(out_dir, n)
    for t in range(1, steps + 1):
        want_mask = ref.random_mask(numel, ratio, SEED, t, kind)
        for r, rk in enumerate(ranks):
            assert np.array_equal(rk["masks"][t - 1].numpy(), want_mask), f"rank {r} step {t}: mask differs"
        xs = [rank_input(r, numel, torch.float32, seed=50 + t).numpy() for r in range(n)]
        want = ref.masked_allreduce(xs, want_mask)
        for r, rk in enumerate(ranks):
            got = rk["results"][t - 1].numpy()
            err = np.max(np.abs(got - want[r]))
            assert err <= 1e-6, f"rank {r} of {n}, step {t}, numel {numel}: off by {err}"
            assert np.array_equal(got[~want_mask], xs[r][~want_mask]), f"rank {r}: unselected elements changed"
        # The masked gather: the same mask's range [3, numel - 2), x[mask] at the front of the buffer, nothing after.
        sub = want_mask[3:numel - 2]
        for r, rk in enumerate(ranks):
            gathered = rk["gathers"][t - 1]
            assert np.array_equal(gathered["mask"].numpy(), sub), f"rank {r} step {t}: gather mask differs"
            assert gathered["count"] == gathered["mask_only"] == int(sub.sum()), (r, t, gathered["count"])
            compact = gathered["compact"].numpy()
            assert np.array_equal(compact[:gathered["count"]], xs[r][3:numel - 2][sub]), f"rank {r} step {t}"
            assert compact[gathered["count"]] == -5.0, f"rank {r} step {t}: written past the selected elements"
    # The selected elements travel densely: 6554 floats of 2**16 at k = 0.1, no index.
    sent = ranks[0]["stats"]["bytes_sent"]
    dense = 4 * 6554
    assert dense <= sent <= 2 * dense + 4096, f"{sent} bytes sent for {dense} bytes of selected values"
    for r, rk in enumerate(ranks):
        bad = rk["bad"]
        for key in ("seed", "numel", "step"):
            assert bad[key].startswith("MismatchError"), f"rank {r} {key}: {bad[key]}"
        assert "seed=1235" in bad["seed"] and "t=2" in bad["step"], bad
        assert bad["ratio"].startswith("ValueError") and bad["kind"].startswith("ValueError"), bad
        # A NaN on one rank, another seed on one, a buffer too small on all: raised on every rank, nothing written.
        assert bad["gather_nan"].startswith("RejectedInputError") and "non-finite" in bad["gather_nan"], bad
        assert bad["gather_seed"].startswith("MismatchError"), bad
        assert bad["gather_room"].startswith("UsageError") and "room for 10" in bad["gather_room"], bad
        assert bad["gather_nan"].endswith("untouched=True") and bad["gather_seed"].endswith("untouched=True"), bad
        assert torch.allclose(rk["after"], torch.full((10,), (n - 1) / 2))


@pytest.mark.parametrize("numel", [0, 7, 1024, 1031, 70_001])
def test_masked_norms_kernel_equals_numpy(numel: int) -> None:
    """The core's one-pass masked norms (SLAMB's phi_max / phi_min) against NumPy's float64 norms of x[M], x[~M]."""
    from hvd_compress.ops import masks as mask_ops

    rng = np.random.default_rng(numel)
    x = rng.standard_normal(numel).astype(np.float32) * rng.uniform(0.1, 10, numel).astype(np.float32)
    mask = rng.random(numel) < 0.1
    got_in, got_out, count = mask_ops.masked_norms(torch.from_numpy(x), torch.from_numpy(mask))
    xd = x.astype(np.float64)
    assert count == int(mask.sum())
    np.testing.assert_allclose(got_in, np.linalg.norm(xd[mask]), rtol=1e-6)
    np.testing.assert_allclose(got_out, np.linalg.norm(xd[~mask]), rtol=1e-6)
    if numel:
        with pytest.raises(hc.UsageError, match="float32"):
            mask_ops.masked_norms(torch.from_numpy(x.astype(np.float64)), torch.from_numpy(mask))


@pytest.mark.parametrize("numel", [0, 5, 4099])
def test_freshness_kernel_equals_numpy(numel: int) -> None:
    """SLAMB step 6 in the core: c = 1 where the mask is set, else beta3 * c, exactly as NumPy's float32."""
    from hvd_compress.ops import masks as mask_ops

    rng = np.random.default_rng(numel)
    c = rng.random(numel, dtype=np.float32)
    mask = rng.random(numel) < 0.3
    want = np.where(mask, np.float32(1), np.float32(0.95) * c)
    got = torch.from_numpy(c.copy())
    mask_ops.freshness_(got, torch.from_numpy(mask), 0.95)
    assert np.array_equal(got.numpy(), want)
